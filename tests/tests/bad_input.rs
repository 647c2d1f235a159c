//! Every kind of bad input, over gRPC against a real `keel serve`: each gets
//! its documented status (see `proto/proto/keel.proto`) and a message that
//! says what to fix, changes nothing, and leaves the broker serving.

use keel_proto::v1 as pb;
use keel_proto::v1::keel_client::KeelClient;
use tonic::transport::Channel;
use tonic::Code;

fn record(value: Vec<u8>) -> pb::Record {
    pb::Record { value, ..Default::default() }
}

fn produce(topic: &str, records: Vec<pb::Record>) -> pb::ProduceRequest {
    pb::ProduceRequest { topic: topic.to_string(), records, ..Default::default() }
}

/// One refused request: what it was, the status it got.
struct Refusal {
    case: &'static str,
    expected: Code,
    hint: &'static str,
    got: Result<(), tonic::Status>,
}

fn refused<T>(case: &'static str, expected: Code, hint: &'static str, got: Result<T, tonic::Status>) -> Refusal {
    Refusal { case, expected, hint, got: got.map(|_| ()) }
}

async fn high_watermark(client: &mut KeelClient<Channel>) -> u64 {
    let topic = client
        .describe_topic(pb::DescribeTopicRequest { topic: "t".into(), leader_only: false })
        .await
        .unwrap()
        .into_inner();
    topic.topic.unwrap().partitions[0].high_watermark
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_documented_status_and_changes_nothing() {
    let (_dir, _broker, address) = keel_tests::one_broker().await;
    let channel = Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    let mut c = KeelClient::new(channel).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20);

    let create = |topic: &str, partitions: u32, replication_factor: u32| pb::CreateTopicRequest {
        topic: topic.to_string(),
        partitions,
        replication_factor,
        ..Default::default()
    };
    c.create_topic(create("t", 1, 1)).await.unwrap();
    // This raw client does not retry: wait for the partition's leader.
    for _ in 0..300 {
        let topic = c
            .describe_topic(pb::DescribeTopicRequest { topic: "t".into(), leader_only: false })
            .await
            .unwrap()
            .into_inner();
        if topic.topic.unwrap().partitions[0].leader != 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    c.produce(produce("t", vec![record(b"one".to_vec()), record(b"two".to_vec())])).await.unwrap();

    // A group with a stale generation: m1 claims at its generation and
    // leaves; m2 joins (a newer generation) and claims the partition.
    let join = |member: &str| pb::JoinGroupRequest {
        group: "g".into(),
        member: member.into(),
        topics: vec!["t".into()],
        session_timeout_ms: 30_000,
        ..Default::default()
    };
    let poll = |member: &str, generation: u64, member_epoch: u64| pb::PollRequest {
        group: "g".into(),
        member: member.into(),
        generation,
        member_epoch,
        topic: "t".into(),
        partition: 0,
        max_records: 10,
        max_bytes: 0,
        max_wait_ms: 0,
        offset: None,
        topic_id: None,
    };
    let ack = |member: &str, generation: u64, member_epoch: u64, offset: u64| pb::AckRequest {
        group: "g".into(),
        member: member.into(),
        generation,
        member_epoch,
        topic: "t".into(),
        partition: 0,
        offset,
        topic_id: None,
    };
    let m1 = c.join_group(join("m1")).await.unwrap().into_inner();
    let (old, old_epoch) = (m1.generation, m1.member_epoch);
    c.poll(poll("m1", old, old_epoch)).await.unwrap();
    c.leave_group(pb::LeaveGroupRequest { group: "g".into(), member: "m1".into(), member_epoch: old_epoch })
        .await
        .unwrap();
    let m2 = c.join_group(join("m2")).await.unwrap().into_inner();
    let (new, epoch) = (m2.generation, m2.member_epoch);
    assert!(new > old);
    let owner = "m2";
    c.poll(poll(owner, new, epoch)).await.unwrap();
    c.ack(ack(owner, new, epoch, 0)).await.unwrap();

    let too_big = (1024 * 1024 + 1) as usize;
    let refusals = vec![
        // Illegal names.
        refused(
            "create: illegal name",
            Code::InvalidArgument,
            "[A-Za-z0-9._-]",
            c.create_topic(create("bad name", 1, 1)).await,
        ),
        refused(
            "produce: illegal name",
            Code::InvalidArgument,
            "[A-Za-z0-9._-]",
            c.produce(produce("bad/name", vec![record(b"x".to_vec())])).await,
        ),
        refused(
            "join: illegal group",
            Code::InvalidArgument,
            "group",
            c.join_group(pb::JoinGroupRequest { group: "".into(), ..join("m3") }).await,
        ),
        refused(
            "join: unknown assignor",
            Code::InvalidArgument,
            "unknown assignor 99",
            c.join_group(pb::JoinGroupRequest { assignor: 99, ..join("m3") }).await,
        ),
        refused(
            "join: another assignor than the members'",
            Code::FailedPrecondition,
            "join with the group's assignor",
            c.join_group(pb::JoinGroupRequest { assignor: pb::Assignor::Range.into(), ..join("m3") }).await,
        ),
        refused("poll: illegal member", Code::InvalidArgument, "member", c.poll(poll("bad member", new, epoch)).await),
        // Unknown topic, partition, group, member, broker.
        refused(
            "produce: unknown topic",
            Code::NotFound,
            "create it first",
            c.produce(produce("nope", vec![record(b"x".to_vec())])).await,
        ),
        refused(
            "read: unknown partition",
            Code::NotFound,
            "partition 5 does not exist",
            c.read(pb::ReadRequest { topic: "t".into(), partition: 5, ..Default::default() }).await,
        ),
        refused(
            "describe: unknown topic",
            Code::NotFound,
            "does not exist",
            c.describe_topic(pb::DescribeTopicRequest { topic: "nope".into(), leader_only: false }).await,
        ),
        refused(
            "delete: unknown topic",
            Code::NotFound,
            "does not exist",
            c.delete_topic(pb::DeleteTopicRequest { topic: "nope".into() }).await,
        ),
        refused(
            "join: unknown topic",
            Code::NotFound,
            "does not exist",
            c.join_group(pb::JoinGroupRequest { topics: vec!["nope".into()], ..join("m3") }).await,
        ),
        refused(
            "describe group: unknown",
            Code::NotFound,
            "does not exist",
            c.describe_group(pb::DescribeGroupRequest { group: "nobody".into() }).await,
        ),
        refused(
            "heartbeat: unknown member",
            Code::NotFound,
            "join",
            c.heartbeat(pb::HeartbeatRequest {
                group: "g".into(),
                member: "ghost".into(),
                generation: new,
                member_epoch: 1,
            })
            .await,
        ),
        refused(
            "leave: unknown member",
            Code::NotFound,
            "join",
            c.leave_group(pb::LeaveGroupRequest { group: "g".into(), member: "ghost".into(), member_epoch: 1 }).await,
        ),
        refused(
            "remove broker: unknown",
            Code::NotFound,
            "not registered",
            c.remove_broker(pb::RemoveBrokerRequest { broker: 9 }).await,
        ),
        refused(
            "move: unknown broker",
            Code::InvalidArgument,
            "not registered",
            c.move_partition(pb::MovePartitionRequest { topic: "t".into(), partition: 0, replicas: vec![9] }).await,
        ),
        // Stale generation: fenced.
        refused("poll: stale generation", Code::Aborted, "fenced", c.poll(poll("m1", old, old_epoch)).await),
        refused("ack: stale generation", Code::Aborted, "fenced", c.ack(ack("m1", old, old_epoch, 1)).await),
        // Forged claims: a generation the coordinator never gave, a process
        // that is not a member, an epoch of an older join.
        refused(
            "poll: forged generation",
            Code::Unavailable,
            "cannot choose",
            c.poll(poll("intruder", 1_000_001, 1)).await,
        ),
        refused(
            "ack: forged generation",
            Code::Unavailable,
            "cannot choose",
            c.ack(ack("intruder", 1_000_001, 1, 1)).await,
        ),
        refused("poll: not a member", Code::Aborted, "not in group", c.poll(poll("intruder", new, 1)).await),
        refused("ack: not a member", Code::Aborted, "not in group", c.ack(ack("intruder", new, 1, 1)).await),
        refused("poll: older member epoch", Code::FailedPrecondition, "fenced", c.poll(poll(owner, new, 0)).await),
        refused("ack: older member epoch", Code::FailedPrecondition, "fenced", c.ack(ack(owner, new, 0, 1)).await),
        refused(
            "heartbeat: older member epoch",
            Code::FailedPrecondition,
            "fenced",
            c.heartbeat(pb::HeartbeatRequest {
                group: "g".into(),
                member: owner.into(),
                generation: new,
                member_epoch: 0,
            })
            .await,
        ),
        refused(
            "leave: older member epoch",
            Code::FailedPrecondition,
            "fenced",
            c.leave_group(pb::LeaveGroupRequest { group: "g".into(), member: owner.into(), member_epoch: 0 }).await,
        ),
        refused(
            "create: non-ASCII name",
            Code::InvalidArgument,
            "'é'",
            c.create_topic(create(&"é".repeat(200), 1, 1)).await,
        ),
        refused(
            "remove broker: the last one",
            Code::FailedPrecondition,
            "last metadata voter",
            c.remove_broker(pb::RemoveBrokerRequest { broker: 1 }).await,
        ),
        // Oversized record and batch; empty batch.
        refused(
            "produce: record too large",
            Code::ResourceExhausted,
            "record 0",
            c.produce(produce("t", vec![record(vec![0; too_big])])).await,
        ),
        refused(
            "produce: too many records",
            Code::ResourceExhausted,
            "split it",
            c.produce(produce("t", (0..10_001).map(|_| record(vec![1])).collect())).await,
        ),
        refused(
            "produce: batch too large",
            Code::ResourceExhausted,
            "split it",
            c.produce(produce("t", (0..5).map(|_| record(vec![0; 1024 * 1024])).collect())).await,
        ),
        refused(
            "produce: empty batch",
            Code::InvalidArgument,
            "at least one record",
            c.produce(produce("t", vec![])).await,
        ),
        // Offsets out of range.
        refused(
            "read: past the high watermark",
            Code::OutOfRange,
            "",
            c.read(pb::ReadRequest { topic: "t".into(), partition: 0, offset: 99, ..Default::default() }).await,
        ),
        refused(
            "ack: past the high watermark",
            Code::OutOfRange,
            "high watermark",
            c.ack(ack(owner, new, epoch, 99)).await,
        ),
        refused(
            "reset: while members remain",
            Code::FailedPrecondition,
            "has members",
            c.reset_group_position(pb::ResetGroupPositionRequest {
                group: "g".into(),
                topic: "t".into(),
                partition: 0,
                to: Some(pb::reset_group_position_request::To::Earliest(true)),
            })
            .await,
        ),
        // Too many (or no) partitions; replication beyond the brokers.
        refused(
            "create: too many partitions",
            Code::InvalidArgument,
            "1 to 1024 partitions",
            c.create_topic(create("wide", 1025, 1)).await,
        ),
        refused(
            "create: no partitions",
            Code::InvalidArgument,
            "partitions",
            c.create_topic(create("none", 0, 1)).await,
        ),
        refused(
            "create: replication beyond brokers",
            Code::InvalidArgument,
            "add brokers",
            c.create_topic(create("deep", 1, 3)).await,
        ),
        refused("create: exists", Code::AlreadyExists, "already exists", c.create_topic(create("t", 1, 1)).await),
        refused(
            "join: bad session timeout",
            Code::InvalidArgument,
            "session timeout",
            c.join_group(pb::JoinGroupRequest { session_timeout_ms: 1, ..join("m3") }).await,
        ),
    ];

    let mut wrong = Vec::new();
    for refusal in &refusals {
        match &refusal.got {
            Ok(()) => wrong.push(format!("{}: succeeded", refusal.case)),
            Err(status) if status.code() != refusal.expected || !status.message().contains(refusal.hint) => {
                wrong.push(format!("{}: got {:?} {:?}", refusal.case, status.code(), status.message()))
            }
            Err(_) => {}
        }
    }
    assert!(wrong.is_empty(), "bad input answered wrongly:\n{}", wrong.join("\n"));

    // Nothing changed, and the broker still serves.
    let topics = c.list_topics(pb::ListTopicsRequest::default()).await.unwrap().into_inner().topics;
    assert_eq!(topics.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["t"]);
    assert_eq!(high_watermark(&mut c).await, 2);
    let group = c.describe_group(pb::DescribeGroupRequest { group: "g".into() }).await.unwrap().into_inner();
    assert_eq!(group.generation, new);
    assert_eq!(group.members.len(), 1);
    // The forged polls and acks fenced nobody: the owner still polls and
    // acks, and the group's position is where the owner left it.
    c.poll(poll(owner, new, epoch)).await.unwrap();
    let position = c
        .group_position(pb::GroupPositionRequest { group: "g".into(), topic: "t".into(), partition: 0 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(position.position, 1);
    c.ack(ack(owner, new, epoch, 1)).await.unwrap();
    c.produce(produce("t", vec![record(b"three".to_vec())])).await.unwrap();
    assert_eq!(high_watermark(&mut c).await, 3);
}
