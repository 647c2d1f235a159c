//! Consumer groups on a real three-broker cluster (one process, loopback):
//! members share the partitions, a rebalance fences the old generation
//! (G5), commits never go backwards (G4), a silent member's session
//! expires on the coordinator's clock, and every record is consumed.

use std::collections::BTreeSet;
use std::time::Duration;

use keel_client::{pb, Client, ClientError, Consumer, Producer, RetryPolicy};
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
    // b claims its partitions by polling them.
    for _ in 0..2 {
        b.poll(100, Duration::from_millis(100)).await.unwrap();
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
    // Four partitions: each poll waits a quarter of this on one of them.
    let started = tokio::time::Instant::now();
    let polled = member.poll(10, Duration::from_secs(8)).await;
    assert!(matches!(&polled, Ok(records) if records.is_empty()), "{polled:?}");
    assert!(started.elapsed() >= Duration::from_millis(1_500), "the poll waited {:?}", started.elapsed());
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
