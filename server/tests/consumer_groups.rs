//! Consumer groups on a real three-broker cluster (one process, loopback):
//! members share the partitions, a rebalance fences the old generation
//! (G5), commits never go backwards (G4), a silent member's session
//! expires on the coordinator's clock, and every record is consumed.

use std::collections::BTreeSet;
use std::time::Duration;

use keel_client::{pb, Client, ClientError, Consumer, Producer, RetryPolicy};
use keel_core::{PartitionIndex, TopicName, TopicPartition};
use keel_server::local_cluster::LocalCluster;
use tempfile::TempDir;
use tonic::Code;

const DEADLINE: Duration = Duration::from_secs(30);

async fn cluster_with_topic(dir: &TempDir) -> (LocalCluster, Client) {
    let cluster = LocalCluster::start(dir.path().to_path_buf(), 3, |_| {}).await.unwrap();
    cluster
        .eventually("brokers registered", DEADLINE, |c| c.node(1).unwrap().metadata().brokers().len() == 3)
        .await
        .unwrap();
    let brokers = cluster.node(1).unwrap().metadata().brokers().clone();
    let addresses: Vec<String> = brokers.values().map(|b| b.address.clone()).collect();
    let client = Client::new(addresses, RetryPolicy::default()).unwrap();
    let request =
        pb::CreateTopicRequest { topic: "jobs".into(), partitions: 4, replication_factor: 3, ..Default::default() };
    client.create_topic(request).await.unwrap();
    (cluster, client)
}

fn record(value: String) -> pb::Record {
    pb::Record { value: value.into_bytes(), ..Default::default() }
}

/// A record on each of `jobs`' four partitions, and `member` of `group`
/// (a minute's session: no heartbeat ends a call early) once it has
/// polled all four, so has claimed every partition and learnt its leaders.
async fn warmed_member(client: &Client, group: &str, member: &str) -> (Producer, Consumer) {
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    for partition in 0..4 {
        producer.send_to("jobs", partition, vec![record(format!("warm-{partition}"))]).await.unwrap();
    }
    let mut consumer = Consumer::join(client.clone(), group, member, vec!["jobs".into()], 60_000).await.unwrap();
    let mut warm = 0;
    for _ in 0..40 {
        warm += consumer.poll(10, Duration::from_millis(200)).await.unwrap().len();
        if warm == 4 {
            break;
        }
    }
    assert_eq!(warm, 4, "the warm-up records were delivered (every partition claimed)");
    (producer, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_and_an_old_generation_is_fenced() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    for i in 0..40 {
        producer.send("jobs", None, vec![record(format!("job-{i}"))]).await.unwrap();
    }

    let mut a = Consumer::join(client.clone(), "workers", "a", vec!["jobs".into()], 10_000).await.unwrap();
    assert_eq!(a.assignment().len(), 4, "a lone member owns every partition");
    let old_generation = a.generation();
    let mut seen = BTreeSet::new();
    // a polls (and so claims) every partition once and acks what it read.
    for _ in 0..4 {
        let got = a.poll(100, Duration::from_millis(200)).await.unwrap();
        if let Some(last) = got.last() {
            a.ack(&last.topic, last.partition, last.record.offset).await.unwrap();
        }
        seen.extend(got.into_iter().map(|d| String::from_utf8(d.record.record.unwrap().value).unwrap()));
    }

    // b joins: the assignment is rebalanced two and two, in a new generation.
    let mut b = Consumer::join(client.clone(), "workers", "b", vec!["jobs".into()], 10_000).await.unwrap();
    assert!(b.generation() > old_generation);
    assert_eq!(b.assignment().len(), 2);
    // b claims its partitions by polling them. What it reads counts: a's
    // four polls above need not have reached every partition (a slow
    // leader answers after them), and b's session then reads on from here
    // (CI once failed with a partition's first ten records missing).
    for _ in 0..2 {
        let got = b.poll(100, Duration::from_millis(100)).await.unwrap();
        if let Some(last) = got.last() {
            b.ack(&last.topic, last.partition, last.record.offset).await.unwrap();
        }
        seen.extend(got.into_iter().map(|d| String::from_utf8(d.record.record.unwrap().value).unwrap()));
    }
    // A request still carrying a's old generation on one of b's partitions
    // is fenced.
    let taken = b.assignment()[0].clone();
    let stale = pb::AckRequest {
        group: "workers".into(),
        member: "a".into(),
        generation: old_generation,
        member_epoch: a.member_epoch(),
        topic: taken.topic.clone(),
        partition: taken.partition,
        offset: 0,
        topic_id: None,
    };
    let route = keel_client::Route::Partition(taken.topic.clone(), taken.partition);
    let fenced = client
        .call(route, |mut c| {
            let r = stale.clone();
            async move { c.ack(r).await }
        })
        .await;
    assert!(matches!(&fenced, Err(ClientError::Refused(s)) if s.code() == Code::Aborted), "{fenced:?}");

    // More records; both members consume everything between them.
    for i in 40..80 {
        producer.send("jobs", None, vec![record(format!("job-{i}"))]).await.unwrap();
    }
    for _ in 0..40 {
        for member in [&mut a, &mut b] {
            let got = member.poll(100, Duration::from_millis(50)).await.unwrap();
            if let Some(last) = got.last() {
                member.ack(&last.topic, last.partition, last.record.offset).await.unwrap();
            }
            seen.extend(got.into_iter().map(|d| String::from_utf8(d.record.record.unwrap().value).unwrap()));
        }
        if seen.len() == 80 {
            break;
        }
    }
    assert_eq!(seen, (0..80).map(|i| format!("job-{i}")).collect::<BTreeSet<_>>());
    a.leave().await.unwrap();
    b.leave().await.unwrap();
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_member_is_expired_and_its_partitions_move_on() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let mut live = Consumer::join(client.clone(), "workers", "live", vec!["jobs".into()], 3_000).await.unwrap();
    // A member that joins and then never heartbeats again.
    let silent = Consumer::join(client.clone(), "workers", "silent", vec!["jobs".into()], 1_000).await.unwrap();
    assert_eq!(silent.assignment().len(), 2);
    // The live member keeps heartbeating (through polls) and soon owns all.
    let started = tokio::time::Instant::now();
    loop {
        live.poll(10, Duration::from_millis(100)).await.unwrap();
        if live.assignment().len() == 4 {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "the silent member was never expired");
    }
    drop(silent);
    cluster.shutdown().await;
}

/// A long poll may wait longer than the client's request timeout: each
/// call's deadline is sized to what it asks for (it used to fail
/// DEADLINE_EXCEEDED and give up). And a deleted topic's claims are
/// forgotten with its groups (soft state that used to leak).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_outlives_the_request_timeout_and_claims_go_with_their_topic() {
    let dir = TempDir::new().unwrap();
    let (cluster, client) = cluster_with_topic(&dir).await;
    let addresses: Vec<String> =
        cluster.node(1).unwrap().metadata().brokers().values().map(|b| b.address.clone()).collect();
    let short = RetryPolicy {
        deadline: Duration::from_secs(4),
        request_timeout: Duration::from_millis(500),
        ..RetryPolicy::default()
    };
    let impatient = Client::new(addresses, short).unwrap();
    let mut member = Consumer::join(impatient, "waiters", "w", vec!["jobs".into()], 10_000).await.unwrap();
    // Learn the partitions' leaders: a poll that names a partition its
    // broker does not lead is answered at once, with the leader.
    for _ in 0..4 {
        member.poll(10, Duration::from_millis(100)).await.unwrap();
    }
    // The warm-up's short polls still in flight answer first; then the
    // member waits on polls of 8 s (each call returns by the next heartbeat,
    // a third of the 10 s session, while its polls go on waiting). Over 10 s
    // those polls are answered, empty, not failed.
    let started = tokio::time::Instant::now();
    let mut longest = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(10) {
        let call = tokio::time::Instant::now();
        let polled = member.poll(10, Duration::from_secs(8)).await;
        assert!(matches!(&polled, Ok(records) if records.is_empty()), "{polled:?}");
        longest = longest.max(call.elapsed());
    }
    assert!(longest >= Duration::from_millis(1_500), "no poll waited: the longest took {longest:?}");
    let claims: usize = cluster.live().map(|node| node.cursor_count()).sum();
    assert!(claims >= 1, "the poll claimed its partition");

    client.delete_topic("jobs").await.unwrap();
    cluster
        .eventually("the deleted topic's claims to go", DEADLINE, |c| {
            c.live().map(|n| n.cursor_count()).sum::<usize>() == 0
        })
        .await
        .unwrap();
}

/// A member waits on every broker leading its partitions at once: a record
/// on any of them is delivered at once, not after the polls of the others
/// have run out (one broker at a time took up to the whole wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_on_any_broker_ends_the_members_wait() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let (_, mut member) = warmed_member(&client, "waiters", "w").await;
    let leaders = partition_leaders(&cluster);
    // Each partition twice in a row: a member polling one broker at a time
    // moves on to the next between the two.
    for (round, partition) in [0, 0, 1, 1, 2, 2, 3, 3].into_iter().enumerate() {
        let mut producer = Producer::new(client.clone(), 0).await.unwrap();
        let sent = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            producer.send_to("jobs", partition, vec![record(format!("job-{round}"))]).await.unwrap();
        });
        let waited = tokio::time::Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && waited.elapsed() < Duration::from_secs(30) {
            got = member.poll(10, Duration::from_secs(20)).await.unwrap();
        }
        sent.await.unwrap();
        let values: Vec<_> =
            got.iter().map(|d| String::from_utf8(d.record.record.clone().unwrap().value).unwrap()).collect();
        assert_eq!(values, [format!("job-{round}")]);
        // Polls of 20 s at each leader: polling one broker at a time, a
        // third of that (6.7 s) each, came to the others' records late.
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "partition {partition}'s record took {:?} (leaders {leaders:?})",
            waited.elapsed()
        );
    }
    cluster.shutdown().await;
}

/// The broker leading each partition of `jobs`, as its replicas' metrics say.
fn partition_leaders(cluster: &LocalCluster) -> Vec<Option<u64>> {
    let node = cluster.node(1).unwrap();
    (0..4)
        .map(|index| {
            let partition = TopicPartition::new(TopicName::new("jobs").unwrap(), PartitionIndex(index));
            let group = node.partition_group(&partition)?;
            node.raft(&group)?.metrics().borrow().current_leader
        })
        .collect()
}

/// One poll serves every assigned partition its broker leads: an idle
/// member keeps one poll going per broker, not one per partition (issue
/// #12: idle consumers must cost almost nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poll_serves_every_partition_its_broker_leads() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    for partition in 0..4 {
        producer.send_to("jobs", partition, vec![record(format!("job-{partition}"))]).await.unwrap();
    }
    let mut member = Consumer::join(client.clone(), "workers", "m", vec!["jobs".into()], 10_000).await.unwrap();
    // Until a broker has applied the join, it refuses the member's polls
    // ("retry shortly"): wait for all three, so that only routing counts.
    let group = keel_core::GroupName::new("workers").unwrap();
    let generation = member.generation();
    cluster
        .eventually("the join applied on every broker", DEADLINE, |c| {
            c.live().all(|node| node.metadata().group(&group).is_some_and(|g| g.generation.0 == generation))
        })
        .await
        .unwrap();
    let mut seen = BTreeSet::new();
    let mut polls = 0;
    while seen.len() < 4 {
        let got = member.poll(100, Duration::from_millis(300)).await.unwrap();
        polls += 1;
        let served: BTreeSet<u32> = member.last_polled().iter().map(|(p, _)| p.partition).collect();
        for delivery in &got {
            assert!(served.contains(&delivery.partition), "a delivery from a partition the poll did not serve");
        }
        seen.extend(got.into_iter().map(|d| d.partition));
        assert!(polls <= 10, "four records not delivered in {polls} polls: {seen:?}");
    }
    // The producer taught the client every leader: one poll per broker
    // leading a partition delivers all four (one per partition would take
    // four).
    assert!(polls <= 3, "{polls} polls for four partitions on three brokers");
    member.leave().await.unwrap();
    cluster.shutdown().await;
}

/// PollPartitions answers each partition on its own: one not led here, not
/// the member's or deleted is refused with what a Poll of it alone would
/// have said, and the others are still served. The request is bounded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_of_many_partitions_answers_each_and_is_bounded() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    producer.send_to("jobs", 0, vec![record("first".into())]).await.unwrap();
    let a = Consumer::join(client.clone(), "workers", "a", vec!["jobs".into()], 10_000).await.unwrap();
    let wanted = |topic: &str, partition: u32| pb::PollPartition {
        topic: topic.into(),
        partition,
        offset: None,
        topic_id: None,
    };
    let request = |partitions: Vec<pb::PollPartition>, generation: u64| pb::PollPartitionsRequest {
        group: "workers".into(),
        member: "a".into(),
        generation,
        member_epoch: a.member_epoch(),
        partitions,
        max_records: 10,
        max_bytes: 0,
        max_wait_ms: 200,
    };
    let poll = |request: pb::PollPartitionsRequest| {
        let client = client.clone();
        async move {
            // Sent to partition 0's leader (the producer taught the client).
            client
                .call(keel_client::Route::Partition("jobs".into(), 0), |mut c| {
                    let r = request.clone();
                    async move { c.poll_partitions(r).await }
                })
                .await
        }
    };

    let mut all = (0..4).map(|p| wanted("jobs", p)).collect::<Vec<_>>();
    all.push(wanted("missing", 0));
    // Broker by broker, the group is known once the join is applied there:
    // until then a partition is refused UNAVAILABLE ("retry shortly").
    let started = tokio::time::Instant::now();
    let answer = loop {
        let answer = poll(request(all.clone(), a.generation())).await.unwrap();
        let behind =
            answer.partitions.iter().any(|p| p.refused.as_ref().is_some_and(|r| r.code == Code::Unavailable as i32));
        if !behind || started.elapsed() > DEADLINE {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let named: Vec<(String, u32)> = answer.partitions.iter().map(|p| (p.topic.clone(), p.partition)).collect();
    let mut expected: Vec<(String, u32)> = (0..4).map(|p| ("jobs".to_string(), p)).collect();
    expected.push(("missing".into(), 0));
    assert_eq!(named, expected, "one answer per partition, in the order asked");
    let first = &answer.partitions[0];
    assert!(first.refused.is_none(), "{first:?}");
    assert_eq!(first.records.len(), 1);
    assert_eq!(first.high_watermark, 1);
    let missing = answer.partitions[4].refused.as_ref().expect("a partition of no topic is refused");
    // Not found, or (from a broker that does not lead the metadata) sent on
    // to the metadata leader to say so for certain.
    assert!(missing.message.contains("does not exist"), "{missing:?}");
    assert!(matches!(Code::from_i32(missing.code), Code::NotFound | Code::FailedPrecondition), "{missing:?}");
    for other in &answer.partitions[1..4] {
        // Served here, or refused naming where to go instead.
        if let Some(refused) = &other.refused {
            assert_eq!(Code::from_i32(refused.code), Code::FailedPrecondition, "{refused:?}");
            assert!(refused.metadata.keys().any(|k| k.starts_with("keel-")), "{refused:?}");
            assert!(other.records.is_empty());
        }
    }

    // A member of an older generation is refused (in the partition's answer,
    // not for the whole request).
    let b = Consumer::join(client.clone(), "workers", "b", vec!["jobs".into()], 10_000).await.unwrap();
    assert!(b.generation() > a.generation());
    // Partition 0's leader may not have applied b's join yet (CI saw it
    // serve a once): it fences a as soon as it has.
    let started = tokio::time::Instant::now();
    let fenced = loop {
        let answer = poll(request(vec![wanted("jobs", 0)], a.generation())).await.unwrap();
        match answer.partitions[0].refused.clone() {
            Some(refused) if refused.code != Code::Unavailable as i32 => break refused,
            _ if started.elapsed() > DEADLINE => panic!("an old generation is not fenced: {answer:?}"),
            _ => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(Code::from_i32(fenced.code), Code::Aborted, "{fenced:?}");

    // Bounded, and each partition named once.
    let refused = |answer: Result<pb::PollPartitionsResponse, ClientError>| match answer {
        Err(ClientError::Refused(status)) => (status.code(), status.message().to_string()),
        other => panic!("not refused: {other:?}"),
    };
    let too_many = (0..1025).map(|p| wanted("jobs", p)).collect();
    let (code, message) = refused(poll(request(too_many, b.generation())).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("at most 1024"), "{message}");
    let (code, message) = refused(poll(request(vec![wanted("jobs", 1), wanted("jobs", 1)], b.generation())).await);
    assert_eq!(code, Code::InvalidArgument);
    assert!(message.contains("named twice"), "{message}");
    cluster.shutdown().await;
}

/// The record and byte budgets of a PollPartitions are shared by its
/// partitions, filled in the order asked (one broker leads them all here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poll_of_many_partitions_shares_one_budget() {
    let dir = TempDir::new().unwrap();
    let mut cluster = LocalCluster::start(dir.path().to_path_buf(), 1, |_| {}).await.unwrap();
    cluster
        .eventually("the broker registered", DEADLINE, |c| c.node(1).unwrap().metadata().brokers().len() == 1)
        .await
        .unwrap();
    let address = cluster.node(1).unwrap().metadata().brokers().values().next().unwrap().address.clone();
    let client = Client::new(vec![address], RetryPolicy::default()).unwrap();
    let request =
        pb::CreateTopicRequest { topic: "jobs".into(), partitions: 4, replication_factor: 1, ..Default::default() };
    client.create_topic(request).await.unwrap();
    let mut producer = Producer::new(client.clone(), 0).await.unwrap();
    for partition in 0..4 {
        let records = (0..3).map(|i| record(format!("{partition}-{i}"))).collect();
        producer.send_to("jobs", partition, records).await.unwrap();
    }
    let member = Consumer::join(client.clone(), "workers", "m", vec!["jobs".into()], 10_000).await.unwrap();
    let poll = |max_records: u32, max_bytes: u64| {
        let request = pb::PollPartitionsRequest {
            group: "workers".into(),
            member: "m".into(),
            generation: member.generation(),
            member_epoch: member.member_epoch(),
            partitions: [2, 0, 1, 3]
                .into_iter()
                .map(|partition| pb::PollPartition { topic: "jobs".into(), partition, offset: None, topic_id: None })
                .collect(),
            max_records,
            max_bytes,
            max_wait_ms: 0,
        };
        let client = client.clone();
        async move {
            let answer = client
                .call(keel_client::Route::Any, |mut c| {
                    let r = request.clone();
                    async move { c.poll_partitions(r).await }
                })
                .await
                .unwrap();
            answer
                .partitions
                .iter()
                .map(|p| {
                    assert!(p.refused.is_none(), "{p:?}");
                    assert_eq!(p.high_watermark, 3, "{p:?}");
                    (p.partition, p.records.len())
                })
                .collect::<Vec<_>>()
        }
    };
    // Five records: partition 2's three, then two of partition 0's.
    assert_eq!(poll(5, 0).await, [(2, 3), (0, 2), (1, 0), (3, 0)]);
    // A byte budget below one record still delivers one record, and no more.
    assert_eq!(poll(100, 1).await, [(2, 1), (0, 0), (1, 0), (3, 0)]);
    assert_eq!(poll(100, 0).await, [(2, 3), (0, 3), (1, 3), (3, 3)]);
    cluster.shutdown().await;
}

/// A claim made through one leader holds under the next: after the leader
/// of a partition stops, the member's polls at the new leader write no
/// claim again (after a failover that was one Raft write in every group
/// the dead broker led, beside their elections: issue #12), and records
/// still reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_serves_the_claim_made_through_the_old_one_without_writing_it_again() {
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let (mut producer, mut member) = warmed_member(&client, "workers", "m").await;

    let partition = TopicPartition::new(TopicName::new("jobs").unwrap(), PartitionIndex(0));
    let old_leader = partition_leaders(&cluster)[0].expect("partition 0 has a leader");
    let claims = |c: &LocalCluster| -> u64 {
        c.live().filter(|node| node.id() != old_leader).map(|node| node.metrics().claims_written()).sum()
    };
    let claims_before = claims(&cluster);
    cluster.stop(old_leader).await;
    // The new leader's log once its own first entry is applied.
    let log_of = |c: &LocalCluster| {
        c.live().find_map(|node| {
            let raft = node.raft(&node.partition_group(&partition)?)?;
            let metrics = raft.metrics().borrow().clone();
            let applied = metrics.last_applied.map(|l| l.index);
            (metrics.current_leader == Some(node.id()) && metrics.last_log_index == applied)
                .then_some((node.id(), applied.unwrap_or(0)))
        })
    };
    cluster.eventually("a new leader of partition 0", DEADLINE, |c| log_of(c).is_some()).await.unwrap();
    let (new_leader, before) = log_of(&cluster).unwrap();
    assert_ne!(new_leader, old_leader);

    // Poll until the new leader has served partition 0 to the member.
    let mut served = false;
    for _ in 0..60 {
        member.poll(10, Duration::from_millis(200)).await.unwrap();
        served |= member.last_polled().iter().any(|(p, _)| p.partition == 0);
        if served {
            break;
        }
    }
    assert!(served, "the new leader of partition 0 served the member");
    // Neither the new leader of partition 0 nor of any other partition the
    // stopped broker led wrote a claim again (the member's polls retried
    // there may have come before the log was looked at: count claims too).
    assert_eq!(claims(&cluster), claims_before, "a new leader wrote a claim it had applied again");
    let after = log_of(&cluster).map(|(_, index)| index);
    assert_eq!(after, Some(before), "the new leader wrote to partition 0's log for a claim it had applied");

    // And its records reach the member, through the same claim.
    producer.send_to("jobs", 0, vec![record("after".to_string())]).await.unwrap();
    let mut got = Vec::new();
    for _ in 0..60 {
        got.extend(member.poll(10, Duration::from_millis(200)).await.unwrap());
        if !got.is_empty() {
            break;
        }
    }
    let values: Vec<_> =
        got.iter().map(|d| String::from_utf8(d.record.record.clone().unwrap().value).unwrap()).collect();
    assert_eq!(values, ["after"]);
    cluster.shutdown().await;
}

/// A stopping broker ends the calls that would hold its connections: a
/// long poll is answered (empty) and a produce stream ends once what it
/// read is answered. Before, the server's graceful shutdown waited for
/// them up to its 5 s limit, and then the groups were stopped under a
/// server that still answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_broker_ends_its_long_polls_and_produce_streams() {
    use keel_proto::v1::keel_client::KeelClient;
    let dir = TempDir::new().unwrap();
    let (mut cluster, client) = cluster_with_topic(&dir).await;
    let (_producer, member) = warmed_member(&client, "workers", "m").await;
    let leader = partition_leaders(&cluster)[0].expect("partition 0 has a leader");
    let metadata = cluster.node(leader).unwrap().metadata();
    let address = metadata.brokers().get(&keel_core::BrokerId(leader)).unwrap().address.clone();
    let channel = tonic::transport::Channel::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();

    // A poll of partition 0, which has nothing new: it would wait 30 s.
    let poll = pb::PollPartitionsRequest {
        group: "workers".into(),
        member: "m".into(),
        generation: member.generation(),
        member_epoch: member.member_epoch(),
        // Past the warm-up record, which was not acked.
        partitions: vec![pb::PollPartition {
            topic: "jobs".into(),
            partition: 0,
            offset: Some(1),
            ..Default::default()
        }],
        max_wait_ms: 30_000,
        ..Default::default()
    };
    let polling = tokio::spawn({
        let mut raw = KeelClient::new(channel.clone());
        async move { raw.poll_partitions(poll).await }
    });
    // A produce stream, answered once (a request without its body: nothing
    // is written that would end the poll) and left open.
    let (requests, queued) = tokio::sync::mpsc::channel::<pb::ProduceStreamRequest>(4);
    let outgoing = futures_util::stream::unfold(queued, |mut queued| async move {
        queued.recv().await.map(|request| (request, queued))
    });
    let mut answers = KeelClient::new(channel).produce_stream(outgoing).await.unwrap().into_inner();
    requests.send(pb::ProduceStreamRequest { id: 1, request: None }).await.unwrap();
    let answer = answers.message().await.unwrap().expect("an answer");
    assert!(matches!(answer.result, Some(pb::produce_stream_response::Result::Error(_))), "{answer:?}");
    // Let the poll reach its wait.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!polling.is_finished(), "the poll was answered before the broker stopped");

    cluster.stop(leader).await;
    assert!(polling.is_finished(), "the stopped broker's long poll is still waiting");
    let polled = polling.await.unwrap();
    assert!(polled.is_ok(), "a stopping broker answers its long polls: {polled:?}");
    let ended = tokio::time::timeout(Duration::from_secs(2), answers.message()).await;
    assert!(matches!(ended, Ok(Ok(None)) | Ok(Err(_))), "the produce stream is still open: {ended:?}");
    drop(requests);
    cluster.shutdown().await;
}
