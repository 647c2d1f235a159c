//! One test per rejection: each invalid command is refused with its typed
//! rejection, a message that says what to do, and no change to the state.

use keel_core::assignor::AssignorKind;
use keel_core::metadata::{MetadataCommand, MetadataRejection, MetadataState, RetentionPolicy};
use keel_core::partition::{
    AppendBatch, MemoryLog, PartitionCommand, PartitionRejection, PartitionState, ProducerBatch, APPEND_BATCHES_MAX,
};
use keel_core::placement::PlacementError;
use keel_core::record::{Record, RecordError};
use keel_core::{BrokerId, Generation, GroupName, Limits, Offset, PartitionIndex, ProducerId, Sequence, TimestampMs};

fn small_limits() -> Limits {
    Limits {
        brokers_max: 3,
        topics_max: 2,
        groups_max: 1,
        members_per_group_max: 1,
        subscriptions_per_member_max: 1,
        partitions_per_topic_max: 4,
        replication_factor_max: 2,
        batch_records_max: 2,
        batch_bytes_max: 10,
        record_value_bytes_max: 8,
        groups_per_partition_max: 1,
        ..Limits::default()
    }
}

/// A cluster of two brokers with topic `t` (2 partitions, 2 replicas) and
/// group `g` with member `m` on `t`.
fn cluster() -> MetadataState {
    let mut state = MetadataState::new(small_limits());
    for command in [
        MetadataCommand::RegisterBroker { broker: BrokerId(1), address: "h:1".into(), internal_address: "ih:1".into() },
        MetadataCommand::RegisterBroker { broker: BrokerId(2), address: "h:2".into(), internal_address: "ih:2".into() },
        create("t", 2, 2),
        join("g", "m", &["t"], 10_000, AssignorKind::StickyBalanced),
    ] {
        state.apply(TimestampMs(1), &command).unwrap();
    }
    start(&mut state, "t");
    state
}

/// Every partition of `topic` reports that its group runs (as its first
/// leader does): only then may it move.
fn start(state: &mut MetadataState, topic: &str) {
    let info = state.topic(&keel_core::TopicName::new(topic).unwrap()).unwrap().clone();
    for (p, placement) in info.partitions.iter().enumerate() {
        let report = MetadataCommand::MoveSettled {
            topic: topic.into(),
            topic_id: info.id,
            partition: PartitionIndex(p as u32),
            epoch: placement.epoch,
        };
        state.apply(TimestampMs(1), &report).unwrap();
    }
}

fn create(topic: &str, partitions: u32, replication_factor: u32) -> MetadataCommand {
    MetadataCommand::CreateTopic {
        topic: topic.into(),
        partitions,
        replication_factor,
        retention: RetentionPolicy::default(),
    }
}

fn join(
    group: &str,
    member: &str,
    topics: &[&str],
    session_timeout_ms: u64,
    assignor: AssignorKind,
) -> MetadataCommand {
    MetadataCommand::JoinGroup {
        group: group.into(),
        member: member.into(),
        topics: topics.iter().map(|t| t.to_string()).collect(),
        session_timeout_ms,
        assignor: Some(assignor),
    }
}

/// Apply to a copy of the cluster and return the rejection, checking that
/// nothing changed and the message is not empty.
fn rejected(command: MetadataCommand) -> MetadataRejection {
    let mut state = cluster();
    let before = state.clone();
    let rejection = state.apply(TimestampMs(2), &command).expect_err("command should be rejected");
    assert_eq!((state.brokers(), state.topics(), state.groups()), (before.brokers(), before.topics(), before.groups()));
    state.check_invariants().unwrap();
    assert!(!rejection.to_string().is_empty());
    rejection
}

#[test]
fn metadata_rejections() {
    assert!(matches!(rejected(create("", 1, 1)), MetadataRejection::InvalidName(_)));
    assert!(matches!(rejected(create("a b", 1, 1)), MetadataRejection::InvalidName(_)));
    let address = |a: &str| MetadataCommand::RegisterBroker {
        broker: BrokerId(9),
        address: a.into(),
        internal_address: "i:9".into(),
    };
    assert!(matches!(rejected(address("")), MetadataRejection::InvalidBrokerAddress { .. }));
    assert!(matches!(rejected(address("a b:1")), MetadataRejection::InvalidBrokerAddress { .. }));
    assert!(matches!(rejected(address(&"x".repeat(300))), MetadataRejection::InvalidBrokerAddress { .. }));
    let mut full = cluster();
    full.apply(TimestampMs(2), &address("h:9")).unwrap();
    let tenth = MetadataCommand::RegisterBroker {
        broker: BrokerId(10),
        address: "h:10".into(),
        internal_address: "ih:10".into(),
    };
    assert_eq!(full.apply(TimestampMs(3), &tenth), Err(MetadataRejection::TooManyBrokers { max: 3 }));
    assert_eq!(
        rejected(MetadataCommand::RemoveBroker { broker: BrokerId(7) }),
        MetadataRejection::UnknownBroker { broker: BrokerId(7) }
    );
    assert_eq!(
        rejected(MetadataCommand::RemoveBroker { broker: BrokerId(1) }),
        MetadataRejection::BrokerHoldsReplicas { broker: BrokerId(1), replicas: 2 }
    );
    assert!(matches!(rejected(create("t", 1, 1)), MetadataRejection::TopicExists { .. }));
    assert!(matches!(
        rejected(MetadataCommand::DeleteTopic { topic: "nope".into() }),
        MetadataRejection::UnknownTopic { .. }
    ));
    assert_eq!(rejected(create("u", 0, 1)), MetadataRejection::InvalidPartitionCount { requested: 0, max: 4 });
    assert_eq!(rejected(create("u", 5, 1)), MetadataRejection::InvalidPartitionCount { requested: 5, max: 4 });
    assert_eq!(rejected(create("u", 1, 3)), MetadataRejection::ReplicationFactorTooHigh { requested: 3, max: 2 });
    assert_eq!(rejected(create("u", 1, 0)), MetadataRejection::Placement(PlacementError::ZeroReplicationFactor));
    let mut one_broker = MetadataState::new(small_limits());
    one_broker
        .apply(
            TimestampMs(1),
            &MetadataCommand::RegisterBroker {
                broker: BrokerId(1),
                address: "h:1".into(),
                internal_address: "ih:1".into(),
            },
        )
        .unwrap();
    assert_eq!(
        one_broker.apply(TimestampMs(2), &create("u", 1, 2)),
        Err(MetadataRejection::Placement(PlacementError::NotEnoughBrokers { replication_factor: 2, brokers: 1 }))
    );
    let mut two_topics = cluster();
    two_topics.apply(TimestampMs(2), &create("u", 1, 1)).unwrap();
    assert_eq!(two_topics.apply(TimestampMs(3), &create("v", 1, 1)), Err(MetadataRejection::TooManyTopics { max: 2 }));
    let mv = |p: u32, replicas: &[u64]| MetadataCommand::MoveReplicas {
        topic: "t".into(),
        partition: PartitionIndex(p),
        replicas: replicas.iter().copied().map(BrokerId).collect(),
    };
    assert!(matches!(rejected(mv(2, &[1])), MetadataRejection::UnknownPartition { partitions: 2, .. }));
    assert!(matches!(rejected(mv(0, &[])), MetadataRejection::InvalidReplicas { .. }));
    assert!(matches!(rejected(mv(0, &[1, 1])), MetadataRejection::InvalidReplicas { .. }));
    assert!(matches!(rejected(mv(0, &[1, 5])), MetadataRejection::InvalidReplicas { .. }));
    // The topic has replication factor 2: a move keeps it.
    assert!(
        matches!(rejected(mv(0, &[1])), MetadataRejection::InvalidReplicas { ref reason, .. } if reason.contains("replication factor 2"))
    );
    assert!(matches!(
        rejected(MetadataCommand::LeaveGroup { group: "h".into(), member: "m".into() }),
        MetadataRejection::UnknownGroup { .. }
    ));
    assert!(matches!(
        rejected(MetadataCommand::ExpireMembers { group: "h".into(), members: vec![] }),
        MetadataRejection::UnknownGroup { .. }
    ));
    assert!(matches!(
        rejected(MetadataCommand::LeaveGroup { group: "g".into(), member: "x".into() }),
        MetadataRejection::UnknownMember { .. }
    ));
    assert_eq!(
        rejected(join("g", "m", &[], 10_000, AssignorKind::StickyBalanced)),
        MetadataRejection::EmptySubscription
    );
    assert_eq!(
        rejected(join("g", "m", &["t", "u"], 10_000, AssignorKind::StickyBalanced)),
        MetadataRejection::TooManySubscriptions { count: 2, max: 1 }
    );
    assert!(matches!(
        rejected(join("g", "m", &["t"], 10, AssignorKind::StickyBalanced)),
        MetadataRejection::SessionTimeoutOutOfRange { requested: 10, .. }
    ));
    assert!(matches!(
        rejected(join("h", "m", &["t"], 10_000, AssignorKind::StickyBalanced)),
        MetadataRejection::TooManyGroups { max: 1 }
    ));
    assert!(matches!(
        rejected(join("g", "n", &["t"], 10_000, AssignorKind::StickyBalanced)),
        MetadataRejection::TooManyMembers { max: 1, .. }
    ));
    assert!(matches!(
        rejected(join("g", "m", &["t"], 10_000, AssignorKind::Range)),
        MetadataRejection::AssignorMismatch { .. }
    ));
}

/// A join that names no assignor takes the group's own, decided in apply
/// (a new group's is sticky), so it is never refused for a mismatch.
#[test]
fn a_join_without_an_assignor_takes_the_groups_own() {
    let mut state = MetadataState::new(Limits::default());
    let broker =
        MetadataCommand::RegisterBroker { broker: BrokerId(1), address: "h:1".into(), internal_address: "ih:1".into() };
    state.apply(TimestampMs(1), &broker).unwrap();
    state.apply(TimestampMs(1), &create("t", 2, 1)).unwrap();
    let unnamed = |group: &str, member: &str| MetadataCommand::JoinGroup {
        group: group.into(),
        member: member.into(),
        topics: vec!["t".into()],
        session_timeout_ms: 10_000,
        assignor: None,
    };
    let group = |state: &MetadataState, name: &str| state.group(&GroupName::new(name).unwrap()).unwrap().assignor;
    state.apply(TimestampMs(2), &join("r", "a", &["t"], 10_000, AssignorKind::Range)).unwrap();
    state.apply(TimestampMs(3), &unnamed("r", "b")).unwrap();
    assert_eq!(group(&state, "r"), AssignorKind::Range);
    state.apply(TimestampMs(4), &unnamed("fresh", "a")).unwrap();
    assert_eq!(group(&state, "fresh"), AssignorKind::StickyBalanced);
}

#[test]
fn settings_change_by_command_unless_the_state_holds_more() {
    let set = |name: &str, value: u64| MetadataCommand::SetLimit { name: name.into(), value };
    // The cluster holds 2 brokers, 1 topic of 2 partitions at RF 2, 1 group of 1 member.
    for (name, value) in [
        ("brokers_max", 1),
        ("partitions_per_topic_max", 1),
        ("replication_factor_max", 1),
        ("topics_max", 0),
        ("groups_max", 0),
        ("members_per_group_max", 0),
        ("broker_address_bytes_max", 3),
    ] {
        let rejection = rejected(set(name, value));
        assert!(
            matches!(rejection, MetadataRejection::SettingBelowCurrent { .. } | MetadataRejection::Setting(_)),
            "{name} = {value}: {rejection}"
        );
    }
    assert!(matches!(rejected(set("batch_bytes_max", 100)), MetadataRejection::Setting(_)));
    assert!(matches!(rejected(set("nothing_like_it", 100)), MetadataRejection::Setting(_)));
    assert_eq!(rejected(set("groups_max", 0)).kind(), "Setting");
    assert_eq!(rejected(set("brokers_max", 1)).kind(), "SettingBelowCurrent");

    let mut state = cluster();
    // groups_max is 1: a second group is refused until the limit is raised.
    let second = join("h", "m2", &["t"], 10_000, AssignorKind::StickyBalanced);
    assert!(matches!(state.apply(TimestampMs(2), &second), Err(MetadataRejection::TooManyGroups { max: 1 })));
    let outcome = state.apply(TimestampMs(3), &set("groups_max", 2)).unwrap();
    assert_eq!(
        outcome,
        keel_core::metadata::MetadataOutcome::LimitSet { name: "groups_max".into(), previous: 1, value: 2 }
    );
    assert_eq!(state.limits().groups_max, 2);
    state.apply(TimestampMs(4), &second).unwrap();
    // Now it holds 2 groups: 1 is refused, 2 is fine.
    assert!(matches!(
        state.apply(TimestampMs(5), &set("groups_max", 1)),
        Err(MetadataRejection::SettingBelowCurrent { current: 2, .. })
    ));
    state.apply(TimestampMs(6), &set("groups_max", 2)).unwrap();
    state.check_invariants().unwrap();
}

#[test]
fn an_empty_group_is_forgotten_after_its_retention_and_not_before() {
    let mut state = cluster();
    let group = keel_core::GroupName::new("g").unwrap();
    state
        .apply(TimestampMs(1), &MetadataCommand::SetLimit { name: "group_retention_ms".into(), value: 1_000 })
        .unwrap();
    let forget = |since: u64| MetadataCommand::ForgetGroup { group: "g".into(), empty_since: TimestampMs(since) };
    // With a member it is never forgotten.
    assert_eq!(state.group(&group).unwrap().empty_since, None);
    let not_expired = |r: Result<_, MetadataRejection>| matches!(r, Err(MetadataRejection::GroupNotExpired { .. }));
    assert!(not_expired(state.apply(TimestampMs(99_999), &forget(0))));
    state.apply(TimestampMs(100), &MetadataCommand::LeaveGroup { group: "g".into(), member: "m".into() }).unwrap();
    let emptied = state.group(&group).unwrap().clone();
    assert_eq!(emptied.empty_since, Some(TimestampMs(100)));
    // Too soon, or naming another emptying: kept.
    assert!(not_expired(state.apply(TimestampMs(1_099), &forget(100))));
    assert!(not_expired(state.apply(TimestampMs(5_000), &forget(99))));
    // Joined and left again: a proposal about the first emptying is stale.
    state.apply(TimestampMs(200), &join("g", "m", &["t"], 10_000, AssignorKind::StickyBalanced)).unwrap();
    assert_eq!(state.group(&group).unwrap().empty_since, None);
    state.apply(TimestampMs(300), &MetadataCommand::LeaveGroup { group: "g".into(), member: "m".into() }).unwrap();
    assert!(not_expired(state.apply(TimestampMs(5_000), &forget(100))));
    // Due: forgotten, and a group of the same name starts above it.
    let last = state.group(&group).unwrap().clone();
    let outcome = state.apply(TimestampMs(1_300), &forget(300)).unwrap();
    assert_eq!(outcome, keel_core::metadata::MetadataOutcome::GroupForgotten { group: group.clone() });
    assert!(state.group(&group).is_none());
    assert!(matches!(state.apply(TimestampMs(1_400), &forget(300)), Err(MetadataRejection::UnknownGroup { .. })));
    state.apply(TimestampMs(1_500), &join("g", "m", &["t"], 10_000, AssignorKind::StickyBalanced)).unwrap();
    let again = state.group(&group).unwrap();
    assert!(again.generation > last.generation, "{again:?} after {last:?}");
    assert!(again.members.values().all(|m| m.member_epoch >= last.next_member_epoch), "{again:?}");
    state.check_invariants().unwrap();
}

#[test]
fn a_partition_forgets_a_group_only_once_it_has_been_idle_for_the_time_given() {
    let (mut state, mut log) = partition();
    let apply = |state: &mut PartitionState, log: &mut MemoryLog, at: u64, command: PartitionCommand| {
        state.apply(log, TimestampMs(at), &command).unwrap()
    };
    let forget = |idle_ms: u64| PartitionCommand::ForgetIdleGroup { group: "g".into(), idle_ms };
    apply(&mut state, &mut log, 100, append(None, &[b"a"])).unwrap();
    let claim =
        PartitionCommand::Claim { group: "g".into(), member: "m".into(), generation: Generation(2), member_epoch: 2 };
    apply(&mut state, &mut log, 1_000, claim).unwrap();
    let group = keel_core::GroupName::new("g").unwrap();
    assert_eq!(state.groups()[&group].touched_at, TimestampMs(1_000), "a claim touches the group");
    apply(&mut state, &mut log, 2_000, commit("m", 2, 0)).unwrap();
    assert_eq!(state.groups()[&group].touched_at, TimestampMs(2_000), "a commit touches the group");
    // Used 999 ms ago: kept, and nothing changes.
    let before = state.groups().clone();
    let kept = apply(&mut state, &mut log, 2_999, forget(1_000));
    assert!(matches!(kept, Err(PartitionRejection::GroupActive { idle_ms_ago: 999, .. })), "{kept:?}");
    assert_eq!(state.groups(), &before);
    // A reset touches it too.
    apply(&mut state, &mut log, 2_500, PartitionCommand::ResetPosition { group: "g".into(), position: Offset(0) })
        .unwrap();
    assert_eq!(state.groups()[&group].touched_at, TimestampMs(2_500));
    assert!(apply(&mut state, &mut log, 3_000, forget(1_000)).is_err());
    // Idle long enough: forgotten, position and claim.
    let forgotten = apply(&mut state, &mut log, 3_500, forget(1_000));
    assert_eq!(forgotten, Ok(keel_core::partition::PartitionOutcome::GroupForgotten { had_position: true }));
    assert!(state.groups().is_empty());
    assert_eq!(state.group_position(&group), state.log_start());
    // Forgetting what is not here changes nothing and is no error.
    let again = apply(&mut state, &mut log, 9_000, forget(1_000));
    assert_eq!(again, Ok(keel_core::partition::PartitionOutcome::GroupForgotten { had_position: false }));
    assert_eq!(
        partition_rejected(PartitionCommand::ForgetIdleGroup { group: "".into(), idle_ms: 1 }).kind(),
        "InvalidName"
    );
    state.check_invariants(&log).unwrap();
}

#[test]
fn a_placement_older_than_the_one_followed_is_refused() {
    use keel_core::partition::PartitionOutcome;
    let (mut state, mut log) = (PartitionState::new(small_limits()), MemoryLog::new());
    let follow = |state: &mut PartitionState, log: &mut MemoryLog, epoch: u64| {
        state.apply(log, TimestampMs(1), &PartitionCommand::FollowPlacement { epoch }).unwrap()
    };
    assert_eq!(follow(&mut state, &mut log, 3), Ok(PartitionOutcome::PlacementFollowed { epoch: 3 }));
    // The same epoch again: a retry of a change that did not finish.
    assert_eq!(follow(&mut state, &mut log, 3), Ok(PartitionOutcome::PlacementFollowed { epoch: 3 }));
    // A leader whose metadata lags behind the move to epoch 3.
    let stale = follow(&mut state, &mut log, 2).unwrap_err();
    assert_eq!(stale, PartitionRejection::StalePlacement { epoch: 2, current: 3 });
    assert!(stale.to_string().contains("metadata lags"), "{stale}");
    assert_eq!(state.placement_epoch(), 3, "a refused placement changes nothing");
    assert_eq!(follow(&mut state, &mut log, 4), Ok(PartitionOutcome::PlacementFollowed { epoch: 4 }));
    assert_eq!(state.placement_epoch(), 4);
    state.check_invariants(&log).unwrap();
}

#[test]
fn a_topic_deleted_and_created_again_keeps_group_generations_rising() {
    let mut state = cluster();
    let group = keel_core::GroupName::new("g").unwrap();
    let first = state.group(&group).unwrap().generation;
    state.apply(TimestampMs(2), &MetadataCommand::DeleteTopic { topic: "t".into() }).unwrap();
    let second = state.group(&group).unwrap().generation;
    state.apply(TimestampMs(3), &create("t", 2, 1)).unwrap();
    let third = state.group(&group).unwrap().generation;
    assert!(first < second && second < third, "{first} {second} {third}");
    state.check_invariants().unwrap();
}

fn partition() -> (PartitionState, MemoryLog) {
    let mut state = PartitionState::new(small_limits());
    let mut log = MemoryLog::new();
    let records = vec![Record::from_value(b"one".to_vec()), Record::from_value(b"two".to_vec())];
    let append = PartitionCommand::Append {
        producer: Some(ProducerBatch { producer: ProducerId(1), sequence: Sequence(0) }),
        records,
    };
    state.apply(&mut log, TimestampMs(1), &append).unwrap().unwrap();
    let claim =
        PartitionCommand::Claim { group: "g".into(), member: "m".into(), generation: Generation(2), member_epoch: 2 };
    state.apply(&mut log, TimestampMs(1), &claim).unwrap().unwrap();
    (state, log)
}

fn partition_rejected(command: PartitionCommand) -> PartitionRejection {
    let (mut state, mut log) = partition();
    let before = (state.clone(), log.clone());
    let rejection = state.apply(&mut log, TimestampMs(2), &command).unwrap().expect_err("command should be rejected");
    assert_eq!(
        (state.high_watermark(), state.groups(), state.producers()),
        (before.0.high_watermark(), before.0.groups(), before.0.producers())
    );
    assert_eq!(log, before.1);
    state.check_invariants(&log).unwrap();
    assert!(!rejection.to_string().is_empty());
    rejection
}

fn append(producer: Option<(u64, u64)>, values: &[&[u8]]) -> PartitionCommand {
    PartitionCommand::Append {
        producer: producer.map(|(p, s)| ProducerBatch { producer: ProducerId(p), sequence: Sequence(s) }),
        records: values.iter().map(|v| Record::from_value(v.to_vec())).collect(),
    }
}

fn commit(member: &str, generation: u64, offset: u64) -> PartitionCommand {
    commit_as(member, generation, 2, offset)
}

fn commit_as(member: &str, generation: u64, member_epoch: u64, offset: u64) -> PartitionCommand {
    PartitionCommand::Commit {
        group: "g".into(),
        member: member.into(),
        generation: Generation(generation),
        member_epoch,
        offset: Offset(offset),
    }
}

#[test]
fn partition_rejections() {
    assert_eq!(partition_rejected(append(None, &[])), PartitionRejection::EmptyBatch);
    assert_eq!(
        partition_rejected(append(None, &[b"a", b"b", b"c"])),
        PartitionRejection::TooManyRecords { count: 3, max: 2 }
    );
    assert_eq!(
        partition_rejected(append(None, &[b"12345678", b"1234"])),
        PartitionRejection::BatchTooLarge { bytes: 12, max: 10 }
    );
    assert!(matches!(
        partition_rejected(append(None, &[b"123456789"])),
        PartitionRejection::InvalidRecord { index: 0, error: RecordError::ValueTooLarge { .. } }
    ));
    assert_eq!(
        partition_rejected(append(Some((1, 3)), &[b"x"])),
        PartitionRejection::SequenceGap { producer: ProducerId(1), expected: Sequence(1), got: Sequence(3) }
    );
    assert_eq!(
        partition_rejected(append(Some((2, 1)), &[b"x"])),
        PartitionRejection::UnknownProducer { producer: ProducerId(2), got: Sequence(1) }
    );
    assert!(matches!(
        partition_rejected(PartitionCommand::Claim {
            group: "".into(),
            member: "m".into(),
            generation: Generation(3),
            member_epoch: 1
        }),
        PartitionRejection::InvalidName(_)
    ));
    assert!(matches!(
        partition_rejected(PartitionCommand::Claim {
            group: "g".into(),
            member: "m".into(),
            generation: Generation(1),
            member_epoch: 1
        }),
        PartitionRejection::Fenced { current: Generation(2), .. }
    ));
    assert!(matches!(
        partition_rejected(PartitionCommand::Claim {
            group: "g".into(),
            member: "n".into(),
            generation: Generation(2),
            member_epoch: 1
        }),
        PartitionRejection::Fenced { .. }
    ));
    assert!(matches!(
        partition_rejected(PartitionCommand::Claim {
            group: "h".into(),
            member: "m".into(),
            generation: Generation(1),
            member_epoch: 1
        }),
        PartitionRejection::TooManyGroups { max: 1 }
    ));
    assert!(matches!(partition_rejected(commit("m", 1, 0)), PartitionRejection::Fenced { .. }));
    // An older join (another process) of the claiming member is fenced; a
    // newer one must claim before it commits.
    let older =
        PartitionCommand::Claim { group: "g".into(), member: "m".into(), generation: Generation(2), member_epoch: 1 };
    assert!(matches!(partition_rejected(older), PartitionRejection::EpochFenced { current: 2, member_epoch: 1, .. }));
    assert!(matches!(partition_rejected(commit_as("m", 2, 1, 0)), PartitionRejection::EpochFenced { .. }));
    assert!(matches!(partition_rejected(commit_as("m", 2, 3, 0)), PartitionRejection::NotClaimed { .. }));
    assert!(matches!(partition_rejected(commit("n", 2, 0)), PartitionRejection::NotClaimed { .. }));
    assert!(matches!(partition_rejected(commit("m", 3, 0)), PartitionRejection::NotClaimed { .. }));
    assert_eq!(
        partition_rejected(commit("m", 2, 2)),
        PartitionRejection::CommitBeyondHighWatermark { offset: Offset(2), high_watermark: Offset(2) }
    );
    assert!(matches!(
        partition_rejected(commit("m", 2, u64::MAX)),
        PartitionRejection::CommitBeyondHighWatermark { .. }
    ));
    assert!(matches!(
        partition_rejected(PartitionCommand::ResetPosition { group: "g".into(), position: Offset(3) }),
        PartitionRejection::PositionOutOfRange { .. }
    ));

    let (mut state, mut log) = partition();
    state.apply(&mut log, TimestampMs(2), &commit("m", 2, 1)).unwrap().unwrap();
    let backwards = state.apply(&mut log, TimestampMs(3), &commit("m", 2, 0)).unwrap();
    assert_eq!(backwards, Err(PartitionRejection::CommitBackwards { offset: Offset(0), position: Offset(2) }));
    // Re-committing the same offset is a harmless no-op (a retried ack).
    assert!(state.apply(&mut log, TimestampMs(3), &commit("m", 2, 1)).unwrap().is_ok());

    // A retry older than the remembered window cannot be answered.
    let mut state = PartitionState::new(Limits { producer_batches_remembered_max: 1, ..small_limits() });
    let mut log = MemoryLog::new();
    for sequence in 0..2 {
        state.apply(&mut log, TimestampMs(1), &append(Some((1, sequence)), &[b"x"])).unwrap().unwrap();
    }
    let old = state.apply(&mut log, TimestampMs(1), &append(Some((1, 0)), &[b"x"])).unwrap();
    assert_eq!(old, Err(PartitionRejection::SequenceTooOld { producer: ProducerId(1), got: Sequence(0) }));
}

fn batch(producer: Option<(u64, u64)>, values: &[&[u8]]) -> AppendBatch {
    let PartitionCommand::Append { producer, records } = append(producer, values) else { unreachable!() };
    AppendBatch { producer, records }
}

#[test]
fn an_entry_of_batches_gives_each_batch_its_own_outcome() {
    use keel_core::partition::PartitionOutcome::{Appended, AppendedBatches};
    let (mut state, mut log) = partition();
    let (applied, rejected) = state.command_counts();
    let batches = vec![
        batch(Some((1, 1)), &[b"three"]),
        // Refused alone: the batches around it still apply.
        batch(None, &[b"a", b"b", b"c"]),
        batch(Some((1, 3)), &[b"x"]),
        // A retry of the first batch inside the same entry.
        batch(Some((1, 1)), &[b"three"]),
        batch(Some((1, 2)), &[b"four", b"five"]),
        batch(None, &[b"six"]),
    ];
    let outcome = state.apply(&mut log, TimestampMs(2), &PartitionCommand::AppendBatches { batches }).unwrap();
    let results = vec![
        Ok(Appended { base_offset: Offset(2), count: 1, duplicate: false }),
        Err(PartitionRejection::TooManyRecords { count: 3, max: 2 }),
        Err(PartitionRejection::SequenceGap { producer: ProducerId(1), expected: Sequence(2), got: Sequence(3) }),
        Ok(Appended { base_offset: Offset(2), count: 1, duplicate: true }),
        Ok(Appended { base_offset: Offset(3), count: 2, duplicate: false }),
        Ok(Appended { base_offset: Offset(5), count: 1, duplicate: false }),
    ];
    assert_eq!(outcome, Ok(AppendedBatches { results }));
    assert_eq!(state.high_watermark(), Offset(6));
    // Each batch counts as a command of its own.
    assert_eq!(state.command_counts(), (applied + 4, rejected + 2));
    state.check_invariants(&log).unwrap();

    assert_eq!(partition_rejected(PartitionCommand::AppendBatches { batches: vec![] }), PartitionRejection::EmptyBatch);
    let too_many = vec![batch(None, &[b"x"]); APPEND_BATCHES_MAX + 1];
    assert_eq!(
        partition_rejected(PartitionCommand::AppendBatches { batches: too_many }),
        PartitionRejection::TooManyBatches { count: APPEND_BATCHES_MAX as u64 + 1, max: APPEND_BATCHES_MAX as u64 }
    );
}

#[test]
fn a_retried_batch_gets_its_original_offsets() {
    let (mut state, mut log) = partition();
    let next = append(Some((1, 1)), &[b"three"]);
    let first = state.apply(&mut log, TimestampMs(2), &next).unwrap().unwrap();
    let retry = state.apply(&mut log, TimestampMs(3), &next).unwrap().unwrap();
    use keel_core::partition::PartitionOutcome::Appended;
    assert_eq!(first, Appended { base_offset: Offset(2), count: 1, duplicate: false });
    assert_eq!(retry, Appended { base_offset: Offset(2), count: 1, duplicate: true });
    assert_eq!(state.high_watermark(), Offset(3));
}

#[test]
fn moving_replicas_bumps_the_placement_epoch() {
    let mut state = cluster();
    let topic = keel_core::TopicName::new("t").unwrap();
    assert_eq!(state.topic(&topic).unwrap().partitions[0].epoch, 0);
    let command = MetadataCommand::MoveReplicas {
        topic: "t".into(),
        partition: PartitionIndex(0),
        replicas: vec![BrokerId(2), BrokerId(1)],
    };
    state.apply(TimestampMs(2), &command).unwrap();
    let placement = &state.topic(&topic).unwrap().partitions[0];
    assert_eq!((placement.replicas.clone(), placement.epoch), (vec![BrokerId(2), BrokerId(1)], 1));
    assert_eq!(state.topic(&topic).unwrap().partitions[1].epoch, 0);
}

#[test]
fn a_partition_whose_group_never_ran_is_neither_moved_nor_drained() {
    // Created while its brokers were down: no replica has run its group yet.
    let mut state = cluster();
    state.apply(TimestampMs(2), &register(3)).unwrap();
    state.apply(TimestampMs(2), &create("new", 1, 2)).unwrap();
    let before = state.clone();
    let to = vec![BrokerId(2), BrokerId(3)];
    let command = MetadataCommand::MoveReplicas { topic: "new".into(), partition: PartitionIndex(0), replicas: to };
    let refused = state.apply(TimestampMs(3), &command);
    assert!(matches!(refused, Err(MetadataRejection::PartitionNotStarted { .. })), "{refused:?}");
    let placement = &state.topic(&keel_core::TopicName::new("new").unwrap()).unwrap().partitions[0];
    let on = placement.replicas[0];
    let drain = MetadataCommand::DrainBroker { broker: on };
    assert!(matches!(state.apply(TimestampMs(3), &drain), Err(MetadataRejection::PartitionNotStarted { .. })));
    assert_eq!(state.topics(), before.topics(), "nothing changed");
    // Once its leader reports the group runs, it moves.
    start(&mut state, "new");
    state.apply(TimestampMs(4), &command).unwrap();
    state.check_invariants().unwrap();
}

fn register(broker: u64) -> MetadataCommand {
    MetadataCommand::RegisterBroker {
        broker: BrokerId(broker),
        address: format!("h:{broker}"),
        internal_address: format!("i:{broker}"),
    }
}

#[test]
fn a_broker_moved_off_a_partition_stays_until_the_group_settles() {
    let mut state = cluster();
    state.apply(TimestampMs(2), &register(3)).unwrap();
    let topic = keel_core::TopicName::new("t").unwrap();
    let topic_id = state.topic(&topic).unwrap().id;
    // Partition 0 moves from [1, 2] (in some order) to [2, 3].
    let to = vec![BrokerId(2), BrokerId(3)];
    let command = MetadataCommand::MoveReplicas { topic: "t".into(), partition: PartitionIndex(0), replicas: to };
    state.apply(TimestampMs(3), &command).unwrap();
    let placement = state.topic(&topic).unwrap().partitions[0].clone();
    assert_eq!(placement.leaving, vec![BrokerId(1)]);
    state.check_invariants().unwrap();
    // Broker 1 is still named by partition 1 and, until its group settles,
    // by partition 0: it may not go.
    let remove = MetadataCommand::RemoveBroker { broker: BrokerId(1) };
    assert!(matches!(state.apply(TimestampMs(4), &remove), Err(MetadataRejection::BrokerHoldsReplicas { .. })));
    // A report for another epoch or another incarnation changes nothing.
    let settled = |topic_id: u64, epoch: u64| MetadataCommand::MoveSettled {
        topic: "t".into(),
        topic_id,
        partition: PartitionIndex(0),
        epoch,
    };
    let before = state.clone();
    let stale = state.apply(TimestampMs(5), &settled(topic_id, placement.epoch - 1));
    assert!(matches!(stale, Err(MetadataRejection::StaleMoveReport { .. })), "{stale:?}");
    assert!(state.apply(TimestampMs(5), &settled(topic_id + 1, placement.epoch)).is_err());
    assert_eq!(state.topics(), before.topics());
    state.apply(TimestampMs(6), &settled(topic_id, placement.epoch)).unwrap();
    assert!(state.topic(&topic).unwrap().partitions[0].leaving.is_empty());
    assert_eq!(state.replicas_on(BrokerId(1)), 1, "partition 1 still has a replica on broker 1");
}

/// Started reports gathered into one command: each partition whose epoch
/// matches starts, a stale one is listed and left as it is, a report of
/// another incarnation or of too many partitions changes nothing.
#[test]
fn reports_of_several_partitions_settle_each_that_is_current() {
    use keel_core::metadata::{MetadataOutcome, SETTLED_REPORTS_MAX};
    let mut state = cluster();
    state.apply(TimestampMs(2), &MetadataCommand::DeleteTopic { topic: "t".into() }).unwrap();
    state.apply(TimestampMs(2), &create("t", 3, 2)).unwrap();
    let topic = keel_core::TopicName::new("t").unwrap();
    let topic_id = state.topic(&topic).unwrap().id;
    let reports = |topic_id: u64, partitions: Vec<(u32, u64)>| MetadataCommand::MovesSettled {
        topic: "t".into(),
        topic_id,
        partitions: partitions.into_iter().map(|(p, epoch)| (PartitionIndex(p), epoch)).collect(),
    };
    let before = state.clone();
    let other = state.apply(TimestampMs(3), &reports(topic_id + 1, vec![(0, 0)]));
    assert!(matches!(other, Err(MetadataRejection::StaleMoveReport { .. })), "{other:?}");
    let many = reports(topic_id, (0..=SETTLED_REPORTS_MAX as u32).map(|p| (p % 3, 0)).collect());
    let too_many = state.apply(TimestampMs(3), &many);
    assert_eq!(
        too_many,
        Err(MetadataRejection::TooManyReports { count: SETTLED_REPORTS_MAX + 1, max: SETTLED_REPORTS_MAX })
    );
    assert!(too_many.unwrap_err().to_string().contains("report them in several"));
    assert_eq!(state.topics(), before.topics());

    let outcome = state.apply(TimestampMs(4), &reports(topic_id, vec![(0, 0), (1, 7), (2, 0)])).unwrap();
    assert_eq!(
        outcome,
        MetadataOutcome::MovesSettled {
            topic: topic.clone(),
            settled: vec![PartitionIndex(0), PartitionIndex(2)],
            stale: vec![PartitionIndex(1)],
        }
    );
    let started: Vec<bool> = state.topic(&topic).unwrap().partitions.iter().map(|p| p.started).collect();
    assert_eq!(started, vec![true, false, true]);
    state.check_invariants().unwrap();
}

#[test]
fn draining_moves_every_replica_off_all_or_nothing() {
    let mut state = cluster();
    // Two brokers, replication factor 2: broker 1's replicas have nowhere to go.
    let before = state.clone();
    let drain = MetadataCommand::DrainBroker { broker: BrokerId(1) };
    assert!(matches!(state.apply(TimestampMs(2), &drain), Err(MetadataRejection::NowhereToDrain { .. })));
    assert_eq!(state.topics(), before.topics());
    assert_eq!(
        state.apply(TimestampMs(2), &MetadataCommand::DrainBroker { broker: BrokerId(9) }),
        Err(MetadataRejection::UnknownBroker { broker: BrokerId(9) })
    );
    state.apply(TimestampMs(3), &register(3)).unwrap();
    let outcome = state.apply(TimestampMs(4), &drain).unwrap();
    assert_eq!(outcome, keel_core::metadata::MetadataOutcome::BrokerDrained { broker: BrokerId(1), moved: 2 });
    state.check_invariants().unwrap();
    let topic = keel_core::TopicName::new("t").unwrap();
    for placement in &state.topic(&topic).unwrap().partitions {
        assert!(!placement.replicas.contains(&BrokerId(1)), "{placement:?}");
        assert_eq!(placement.leaving, vec![BrokerId(1)]);
        assert_eq!(placement.replicas.len(), 2);
    }
    assert!(state.brokers()[&BrokerId(1)].draining);
    // Until the groups settle the broker counts as holding them.
    assert_eq!(state.replicas_on(BrokerId(1)), 2);
    // New topics place nothing on a draining broker.
    state.apply(TimestampMs(5), &MetadataCommand::DeleteTopic { topic: "t".into() }).unwrap();
    state.apply(TimestampMs(6), &create("u", 4, 2)).unwrap();
    let placed = &state.topic(&keel_core::TopicName::new("u").unwrap()).unwrap().partitions;
    assert!(placed.iter().all(|p| !p.replicas.contains(&BrokerId(1))), "{placed:?}");
    // Registering again (a restart) keeps it draining.
    state.apply(TimestampMs(7), &register(1)).unwrap();
    assert!(state.brokers()[&BrokerId(1)].draining);
}

#[test]
fn rejection_kinds_are_listed_once_each() {
    use keel_core::partition::PartitionRejection;
    for kinds in [&MetadataRejection::KINDS[..], &PartitionRejection::KINDS[..]] {
        let distinct: std::collections::BTreeSet<&str> = kinds.iter().copied().collect();
        assert_eq!(distinct.len(), kinds.len(), "{kinds:?}");
    }
    let examples = [
        PartitionRejection::EmptyBatch,
        PartitionRejection::OffsetOverflow,
        PartitionRejection::TooManyGroups { max: 1 },
        PartitionRejection::TooManyBatches { count: 2, max: 1 },
    ];
    for rejection in examples {
        assert!(PartitionRejection::KINDS.contains(&rejection.kind()), "{rejection:?}");
    }
    let listed = MetadataRejection::ProducerIdsExhausted;
    assert_eq!(listed.kind(), "ProducerIdsExhausted");
}
