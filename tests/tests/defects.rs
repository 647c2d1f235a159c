//! Regression tests for defects found by testing keel from outside (one
//! real `keel serve`, raw gRPC and the client library): deleted and
//! re-created topics under live groups, reply budgets, producers the
//! partition forgot, and long polls on a deleted topic.

use std::time::Duration;

use keel_client::{Client, ClientError, Consumer, Producer, RetryPolicy};
use keel_proto::v1 as pb;
use keel_proto::v1::keel_client::KeelClient;
use keel_tests::{free_port, one_broker, Broker};
use tonic::transport::Channel;
use tonic::Code;

async fn raw(address: &str) -> KeelClient<Channel> {
    let channel = Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
    KeelClient::new(channel).max_decoding_message_size(64 << 20).max_encoding_message_size(64 << 20)
}

fn client(address: &str) -> Client {
    Client::new(vec![address.to_string()], RetryPolicy::default()).unwrap()
}

async fn create(client: &Client, topic: &str, partitions: u32) {
    let request =
        pb::CreateTopicRequest { topic: topic.into(), partitions, replication_factor: 1, ..Default::default() };
    client.create_topic(request).await.unwrap();
}

/// Join group `g` as member `m`, subscribed to `topic`, over raw gRPC.
async fn join(c: &mut KeelClient<Channel>, topic: &str) -> pb::JoinGroupResponse {
    let request = pb::JoinGroupRequest {
        group: "g".into(),
        member: "m".into(),
        topics: vec![topic.into()],
        session_timeout_ms: 10_000,
        ..Default::default()
    };
    c.join_group(request).await.unwrap().into_inner()
}

/// As member `m` of `joined`, claim partition 0 of `topic` (retrying while
/// its new group elects a leader), then start a poll that waits up to
/// `max_wait_ms` on it.
async fn claim_then_wait(
    c: &mut KeelClient<Channel>,
    topic: &str,
    joined: &pb::JoinGroupResponse,
    max_wait_ms: u64,
) -> tokio::task::JoinHandle<Result<tonic::Response<pb::PollResponse>, tonic::Status>> {
    let poll = pb::PollRequest {
        group: "g".into(),
        member: "m".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
        topic: topic.into(),
        partition: 0,
        max_records: 10,
        max_bytes: 0,
        max_wait_ms,
        offset: None,
        topic_id: None,
    };
    let first = pb::PollRequest { max_wait_ms: 0, ..poll.clone() };
    let mut claimed = c.poll(first.clone()).await;
    for _ in 0..100 {
        if claimed.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        claimed = c.poll(first.clone()).await;
    }
    claimed.unwrap();
    let mut c = c.clone();
    tokio::spawn(async move { c.poll(poll).await })
}

fn record(value: Vec<u8>) -> pb::Record {
    pb::Record { value, ..Default::default() }
}

/// Poll until `want` records arrived or the time is up.
async fn consume(consumer: &mut Consumer, want: usize) -> Vec<String> {
    let mut values = Vec::new();
    for _ in 0..100 {
        if values.len() >= want {
            break;
        }
        let deliveries = consumer.poll(100, Duration::from_millis(200)).await.unwrap();
        for delivery in &deliveries {
            values.push(String::from_utf8_lossy(&delivery.record.record.as_ref().unwrap().value).to_string());
        }
        if let Some(last) = deliveries.last() {
            consumer.ack_in(&last.topic, last.topic_id, last.partition, last.record.offset).await.unwrap();
        }
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_live_through_deleted_and_re_created_topics() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "kept", 1).await;
    create(&client, "dropped", 1).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    producer.send_to("kept", 0, vec![record(b"k1".to_vec())]).await.unwrap();
    producer.send_to("dropped", 0, vec![record(b"d1".to_vec())]).await.unwrap();
    let topics = vec!["kept".to_string(), "dropped".to_string()];
    let mut consumer = Consumer::join(client.clone(), "g", "m", topics, 10_000).await.unwrap();
    let mut got = consume(&mut consumer, 2).await;
    got.sort();
    assert_eq!(got, ["d1", "k1"]);

    // Deleting a subscribed topic: the group goes on with the other one
    // (the rejoin used to be refused NOT_FOUND, wedging every member).
    client.delete_topic("dropped").await.unwrap();
    producer.send_to("kept", 0, vec![record(b"k2".to_vec())]).await.unwrap();
    assert_eq!(consume(&mut consumer, 1).await, ["k2"]);

    // Created again: a new incarnation, whose records the group reads
    // (stale soft state of the old one used to answer "poll again" forever).
    create(&client, "dropped", 1).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    producer.send_to("dropped", 0, vec![record(b"d2".to_vec())]).await.unwrap();
    assert_eq!(consume(&mut consumer, 1).await, ["d2"]);
    consumer.leave().await.unwrap();
}

/// An offset read before its topic was deleted and created again, acked
/// afterwards, is refused and moves nothing: the new log's first record is
/// still delivered. Found by the simulation (seed 160000093): a slow member
/// acked such an offset under the new incarnation, and the group skipped
/// a record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_of_a_deleted_incarnation_moves_nothing() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "again", 1).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    producer.send_to("again", 0, vec![record(b"old-0".to_vec()), record(b"old-1".to_vec())]).await.unwrap();
    let mut consumer = Consumer::join(client.clone(), "g", "m", vec!["again".into()], 10_000).await.unwrap();
    let mut read = Vec::new();
    for _ in 0..50 {
        read.extend(consumer.poll(100, Duration::from_millis(200)).await.unwrap());
        if read.len() >= 2 {
            break;
        }
    }
    let stale = read.last().expect("records of the first incarnation").clone();
    assert_ne!(stale.topic_id, 0);

    client.delete_topic("again").await.unwrap();
    create(&client, "again", 1).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    producer.send_to("again", 0, vec![record(b"new-0".to_vec()), record(b"new-1".to_vec())]).await.unwrap();
    // The member learns the new incarnation (its next poll rejoins).
    let mut fresh = Vec::new();
    for _ in 0..50 {
        fresh.extend(consumer.poll(100, Duration::from_millis(200)).await.unwrap());
        if !fresh.is_empty() {
            break;
        }
    }
    assert!(fresh.iter().all(|d| d.topic_id > stale.topic_id), "{fresh:?}");

    // Refused: the member rejoins, as when fenced.
    let acked = consumer.ack_in("again", stale.topic_id, 0, stale.record.offset).await.unwrap();
    assert_eq!(acked, None, "an ack of a deleted incarnation must be refused");
    let notices = consumer.take_notices();
    assert!(
        notices.iter().any(|n| n.starts_with("ack of again/0 refused") && n.contains("was deleted")),
        "{notices:?}"
    );
    let position = client.group_position("g", "again", 0).await.unwrap();
    assert_eq!(position.position, 0, "the stale ack moved the new log's position: {position:?}");
    consumer.leave().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_keep_to_the_servers_byte_budget() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "big", 1).await;
    // 20 records of 1 MiB.
    for _ in 0..5 {
        let records = (0..4).map(|_| record(vec![7; 1024 * 1024])).collect();
        let request = pb::ProduceRequest { topic: "big".into(), partition: 0, records, ..Default::default() };
        client.produce(request).await.unwrap();
    }
    let mut c = raw(&address).await;
    // 0 means the server's default budget (4 MiB), not "unlimited" and not
    // "nothing".
    let read = |max_records: u32, max_bytes: u64| pb::ReadRequest {
        topic: "big".into(),
        partition: 0,
        offset: 0,
        max_records,
        max_bytes,
        any_replica: false,
    };
    let defaults = c.read(read(0, 0)).await.unwrap().into_inner().records.len();
    assert!((1..=5).contains(&defaults), "a default read returned {defaults} records of 1 MiB");
    // Asking for everything is capped (16 MiB plus one record).
    let unlimited = c.read(read(10_000, u64::MAX)).await.unwrap().into_inner().records.len();
    assert!((1..=17).contains(&unlimited), "an unlimited read returned {unlimited} records of 1 MiB");

    let joined = join(&mut c, "big").await;
    let poll = pb::PollRequest {
        group: "g".into(),
        member: "m".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
        topic: "big".into(),
        partition: 0,
        max_records: 0,
        max_bytes: 0,
        max_wait_ms: 0,
        offset: None,
        topic_id: None,
    };
    let polled = c.poll(poll).await.unwrap().into_inner().records.len();
    assert!((1..=5).contains(&polled), "a default poll returned {polled} records of 1 MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_the_partition_forgot_recovers_with_a_new_id() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "t", 1).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    let id = producer.producer_id();
    producer.send_to("t", 0, vec![record(b"0".to_vec())]).await.unwrap();
    // Someone else sends under the same id, far ahead: the producer's next
    // sequence is older than anything the partition remembers.
    for sequence in 1..=7 {
        let request = pb::ProduceRequest {
            topic: "t".into(),
            partition: 0,
            records: vec![record(b"other".to_vec())],
            idempotent: true,
            producer_id: id,
            sequence,
            topic_id: None,
        };
        client.produce(request).await.unwrap();
    }
    let refused = producer.send_to("t", 0, vec![record(b"1".to_vec())]).await;
    match refused {
        Err(ClientError::ProducerReset { old_producer_id, new_producer_id, .. }) => {
            assert_eq!(old_producer_id, id);
            assert_ne!(new_producer_id, id);
        }
        other => panic!("expected a producer reset, got {other:?}"),
    }
    // Not wedged: the next sends go through under the new id.
    let sent = producer.send_to("t", 0, vec![record(b"1".to_vec())]).await.unwrap();
    assert_eq!((sent.base_offset, sent.duplicate), (8, false));
    producer.send_to("t", 0, vec![record(b"2".to_vec())]).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_on_a_deleted_topic_is_told_not_found() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "doomed", 1).await;
    let mut c = raw(&address).await;
    let joined = join(&mut c, "doomed").await;
    // Claim first, then wait on the empty partition while it is deleted.
    let waiting = claim_then_wait(&mut c, "doomed", &joined, 20_000).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    client.delete_topic("doomed").await.unwrap();
    let status = tokio::time::timeout(Duration::from_secs(15), waiting).await.unwrap().unwrap().unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
}

/// A member waiting in a long poll whose generation is fenced meanwhile (a
/// second member joined: a rebalance) is told so. A poll used to look only
/// at the partition's claim while it waited, and answered an empty poll at
/// its deadline as if nothing had happened.
#[tokio::test]
async fn a_long_poll_of_a_member_fenced_while_it_waits_is_told_so() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    // Two partitions: the second member takes one, so the assignment
    // changes and the generation moves on.
    create(&client, "shared", 2).await;
    let mut c = raw(&address).await;
    let joined = join(&mut c, "shared").await;
    let waiting = claim_then_wait(&mut c, "shared", &joined, 3_000).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = pb::JoinGroupRequest {
        group: "g".into(),
        member: "m2".into(),
        topics: vec!["shared".into()],
        session_timeout_ms: 10_000,
        ..Default::default()
    };
    let rejoined = c.join_group(second).await.unwrap().into_inner();
    assert!(rejoined.generation > joined.generation);
    let status = tokio::time::timeout(Duration::from_secs(15), waiting).await.unwrap().unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert!(status.message().contains("is fenced"), "{status:?}");
}

/// A leave with an epoch no join handed out used to be taken: anyone who
/// knew a member's id could remove it from its group.
#[tokio::test]
async fn a_leave_with_a_forged_member_epoch_is_refused() {
    let (_dir, _broker, address) = one_broker().await;
    create(&client(&address), "left", 1).await;
    let mut c = raw(&address).await;
    let joined = join(&mut c, "left").await;
    let forged = pb::LeaveGroupRequest { group: "g".into(), member: "m".into(), member_epoch: u64::MAX };
    let status = c.leave_group(forged).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    let group = c.describe_group(pb::DescribeGroupRequest { group: "g".into() }).await.unwrap().into_inner();
    assert_eq!(group.members.len(), 1, "a forged leave removed the member");
    let own = pb::LeaveGroupRequest { group: "g".into(), member: "m".into(), member_epoch: joined.member_epoch };
    c.leave_group(own).await.unwrap();
}

/// A forged Raft vote with a term openraft cannot take: it used to be served
/// on the client port, granted, and panic the metadata group for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_raft_message_cannot_reach_or_break_a_broker() {
    use keel_proto::raft::raft_transport_client::RaftTransportClient;
    use keel_proto::raft::RaftRequest;
    let (dir, broker, address) = one_broker().await;
    let cluster_id = client(&address).describe_cluster().await.unwrap().cluster_id;
    let secret = std::fs::read_to_string(dir.path().join("keel-data").join("cluster-secret")).unwrap();
    let last = openraft::LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 9), u64::MAX / 2);
    let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(u64::MAX, 9), Some(last));
    let forged = |secret: &str| RaftRequest {
        group: "metadata".into(),
        payload: postcard::to_stdvec(&vote).unwrap(),
        cluster_id,
        secret: secret.into(),
    };
    let connect = |address: String| async move {
        RaftTransportClient::new(Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap())
    };
    // The client port does not serve the Raft transport at all.
    let refused = connect(address.clone()).await.vote(forged(&secret)).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");
    // The internal port wants the cluster secret...
    let internal = keel_tests::internal_address(&address);
    let refused = connect(internal.clone()).await.vote(forged("guess")).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // ... and, even with it, refuses a term no real election reaches.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refused = connect(internal).await.vote(forged(&secret)).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    // The metadata group still takes writes, now and after a restart.
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(&client(&address), "after", 1).await;
    drop(broker);
    let restarted = tokio::task::spawn_blocking({
        let (dir, address) = (dir.path().to_path_buf(), address.clone());
        move || Broker::start(&dir, &address, &[])
    })
    .await
    .unwrap();
    create(&client(&address), "after-restart", 1).await;
    drop(restarted);
}

#[test]
fn a_broker_that_cannot_listen_or_open_its_data_says_why_and_exits() {
    let dir = tempfile::TempDir::new().unwrap();
    let address = format!("127.0.0.1:{}", free_port());
    let serve = |args: &[&str]| {
        std::process::Command::new(keel_tests::keel_binary())
            .arg("serve")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    // The client port is taken.
    let taken = std::net::TcpListener::bind(&address).unwrap();
    let output = serve(&["--listen", &address]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot listen for clients on"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
    drop(taken);
    // The data directory is in use by a running broker.
    let _running = Broker::start(dir.path(), &address, &[]);
    let other = format!("127.0.0.1:{}", free_port());
    let output = serve(&["--listen", &other]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");
    assert!(stderr.contains("in use"), "{stderr}");
}

/// Writes name the topic incarnation they mean: one deleted and created
/// again under the client is refused, never written into (and then deleted
/// with the old incarnation), and a broker that does not know the named
/// incarnation yet asks the client to retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_land_only_in_the_topic_incarnation_they_name() {
    let (_dir, _broker, address) = one_broker().await;
    let client = client(&address);
    create(&client, "t", 1).await;
    let old = client.describe_topic_fresh("t").await.unwrap().id;
    client.delete_topic("t").await.unwrap();
    create(&client, "t", 1).await;
    let new = client.describe_topic_fresh("t").await.unwrap().id;
    assert!(new > old);
    let mut c = raw(&address).await;
    let produce = |topic_id: Option<u64>| pb::ProduceRequest {
        topic: "t".into(),
        records: vec![record(b"x".to_vec())],
        topic_id,
        ..Default::default()
    };
    let deleted = c.produce(produce(Some(old))).await.unwrap_err();
    assert_eq!(deleted.code(), Code::NotFound, "{deleted:?}");
    assert!(deleted.message().contains("was deleted"), "{deleted:?}");
    let ahead = c.produce(produce(Some(new + 1))).await.unwrap_err();
    assert_eq!(ahead.code(), Code::Unavailable, "{ahead:?}");
    // (The retrying client: the new partition may not have its leader yet.)
    client.produce(produce(Some(new))).await.unwrap();
    // Polls and acks name the incarnation of their assignment the same way.
    let joined = join(&mut c, "t").await;
    assert_eq!(joined.partitions[0].topic_id, new);
    let poll = |topic_id: Option<u64>| pb::PollRequest {
        group: "g".into(),
        member: "m".into(),
        generation: joined.generation,
        member_epoch: joined.member_epoch,
        topic: "t".into(),
        partition: 0,
        max_records: 10,
        max_bytes: 0,
        max_wait_ms: 0,
        offset: None,
        topic_id,
    };
    assert_eq!(c.poll(poll(Some(old))).await.unwrap_err().code(), Code::NotFound);
    assert_eq!(c.poll(poll(Some(new))).await.unwrap().into_inner().records.len(), 1);
    let high_watermark = c
        .describe_topic(pb::DescribeTopicRequest { topic: "t".into(), leader_only: false })
        .await
        .unwrap()
        .into_inner()
        .topic
        .unwrap()
        .partitions[0]
        .high_watermark;
    assert_eq!(high_watermark, 1, "only the write that named the live incarnation landed");
}
