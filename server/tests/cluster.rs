//! A three-broker cluster in one process on real tokio over real loopback
//! sockets: the metadata group and partition groups elect and commit, a
//! killed broker does not stop commits, and a restarted broker reopens its
//! groups from disk and catches up.

use std::collections::BTreeMap;
use std::time::Duration;

use keel_core::metadata::{MetadataCommand, MetadataOutcome, RetentionPolicy};
use keel_core::partition::{PartitionCommand, PartitionOutcome, ProducerBatch};
use keel_core::record::Record;
use keel_core::{Offset, PartitionIndex, ProducerId, Sequence, TopicName, TopicPartition};
use keel_server::clock::Clock;
use keel_server::group::GroupId;
use keel_server::node::{Node, NodeConfig, ProposeError};
use keel_server::raft::types::{Command, Response};
use keel_server::storage::NodeStore;
use tempfile::TempDir;

const DEADLINE: Duration = Duration::from_secs(30);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

async fn start(id: u64, dir: &TempDir, voters: &BTreeMap<u64, String>) -> Node {
    start_with(id, dir, voters, |_| {}).await
}

async fn start_with(
    id: u64,
    dir: &TempDir,
    voters: &BTreeMap<u64, String>,
    adjust: impl FnOnce(&mut NodeConfig),
) -> Node {
    let address = voters[&id].clone();
    let mut config = NodeConfig::new(id, address.parse().unwrap(), address, voters.clone());
    adjust(&mut config);
    let store = NodeStore::open(dir.path()).unwrap();
    Node::start(config, store, Clock::system()).await.unwrap()
}

/// Propose on whichever live broker leads the group, retrying through
/// elections until the deadline.
async fn propose(nodes: &[Option<Node>], group: &GroupId, command: Command) -> Response {
    let started = tokio::time::Instant::now();
    loop {
        for node in nodes.iter().flatten() {
            match node.propose(group, command.clone()).await {
                Ok(response) => return response,
                Err(ProposeError::NotLeader { .. } | ProposeError::GroupNotHere { .. }) => {}
                Err(error) => panic!("{error}"),
            }
        }
        assert!(
            started.elapsed() < DEADLINE,
            "no leader for {group} within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let started = tokio::time::Instant::now();
    while !check() {
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn append(producer: u64, sequence: u64, value: &str) -> Command {
    Command::Partition(PartitionCommand::Append {
        producer: Some(ProducerBatch {
            producer: ProducerId(producer),
            sequence: Sequence(sequence),
        }),
        records: vec![Record::from_value(value.as_bytes().to_vec())],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_brokers_commit_survive_a_kill_and_catch_up_after_restart() {
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let voters: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Some(start(id, &dirs[id as usize - 1], &voters).await));
    }

    // The metadata leader registers every broker; then a topic is placed.
    eventually("all brokers registered", || {
        nodes[0].as_ref().unwrap().metadata().brokers().len() == 3
    })
    .await;
    let create = MetadataCommand::CreateTopic {
        topic: "orders".into(),
        partitions: 2,
        replication_factor: 3,
        retention: RetentionPolicy::default(),
    };
    let created = propose(&nodes, &GroupId::Metadata, Command::Metadata(create)).await;
    assert!(
        matches!(
            created,
            Response::Metadata(Ok(MetadataOutcome::TopicCreated { .. }))
        ),
        "{created:?}"
    );

    let partition = TopicPartition::new(TopicName::new("orders").unwrap(), PartitionIndex(0));
    let group = GroupId::Partition(partition.clone());
    eventually("partition groups on every broker", || {
        nodes.iter().flatten().all(|n| n.groups().contains(&group))
    })
    .await;
    for sequence in 0..10 {
        let response = propose(
            &nodes,
            &group,
            append(7, sequence, &format!("record-{sequence}")),
        )
        .await;
        let expected = Response::Partition(Ok(PartitionOutcome::Appended {
            base_offset: Offset(sequence),
            count: 1,
            duplicate: false,
        }));
        assert_eq!(response, expected);
    }

    // Kill the broker leading the partition; commits go on with two of three.
    let leader = nodes[0]
        .as_ref()
        .unwrap()
        .raft(&group)
        .unwrap()
        .current_leader()
        .await
        .expect("a partition leader");
    let victim = leader as usize - 1;
    nodes[victim].take().unwrap().shutdown().await;
    for sequence in 10..20 {
        let response = propose(
            &nodes,
            &group,
            append(7, sequence, &format!("record-{sequence}")),
        )
        .await;
        assert!(
            matches!(
                response,
                Response::Partition(Ok(PartitionOutcome::Appended {
                    duplicate: false,
                    ..
                }))
            ),
            "{response:?}"
        );
    }
    // A retry of an acknowledged batch is answered with its original offset.
    let retry = propose(&nodes, &group, append(7, 19, "record-19")).await;
    assert_eq!(
        retry,
        Response::Partition(Ok(PartitionOutcome::Appended {
            base_offset: Offset(19),
            count: 1,
            duplicate: true
        }))
    );

    // Restart it from its data directory: it reopens its groups and catches up.
    tokio::time::sleep(Duration::from_millis(200)).await;
    nodes[victim] = Some(start(leader, &dirs[victim], &voters).await);
    let restarted = nodes[victim].clone().unwrap();
    eventually("restarted broker caught up", || {
        restarted
            .partition(&partition)
            .is_some_and(|p| p.high_watermark() == Offset(20))
    })
    .await;
    let values = restarted
        .read_partition(&partition, |state, log| {
            state.read(log, Offset(0), 100, u64::MAX).unwrap()
        })
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8(r.record.value).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        values,
        (0..20).map(|i| format!("record-{i}")).collect::<Vec<_>>()
    );
    for node in nodes.iter().flatten() {
        node.shutdown().await;
    }
}

/// A broker that was down while the others snapshotted and purged their
/// logs catches up by installing a snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_broker_catches_up_by_snapshot() {
    let snapshot_often = |config: &mut NodeConfig| {
        config.raft.snapshot_policy = openraft::SnapshotPolicy::LogsSinceLast(10);
        config.raft.max_in_snapshot_log_to_keep = 0;
        config.raft.purge_batch_size = 1;
    };
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new().unwrap()).collect();
    let voters: BTreeMap<u64, String> = (1..=3)
        .map(|id| (id, format!("127.0.0.1:{}", free_port())))
        .collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Some(
            start_with(id, &dirs[id as usize - 1], &voters, snapshot_often).await,
        ));
    }
    eventually("all brokers registered", || {
        nodes[0].as_ref().unwrap().metadata().brokers().len() == 3
    })
    .await;
    let create = MetadataCommand::CreateTopic {
        topic: "logs".into(),
        partitions: 1,
        replication_factor: 3,
        retention: RetentionPolicy::default(),
    };
    propose(&nodes, &GroupId::Metadata, Command::Metadata(create)).await;
    let partition = TopicPartition::new(TopicName::new("logs").unwrap(), PartitionIndex(0));
    let group = GroupId::Partition(partition.clone());
    eventually("partition groups on every broker", || {
        nodes.iter().flatten().all(|n| n.groups().contains(&group))
    })
    .await;

    // Broker 3 goes down; the others write on, snapshot and purge.
    nodes[2].take().unwrap().shutdown().await;
    for sequence in 0..60 {
        propose(
            &nodes,
            &group,
            append(9, sequence, &format!("entry-{sequence}")),
        )
        .await;
    }
    let purged = |node: &Node| {
        node.raft(&group)
            .unwrap()
            .metrics()
            .borrow()
            .purged
            .map_or(0, |p| p.index)
    };
    eventually("the live brokers purged their logs", || {
        nodes.iter().flatten().all(|n| purged(n) >= 40)
    })
    .await;

    nodes[2] = Some(start_with(3, &dirs[2], &voters, snapshot_often).await);
    let restarted = nodes[2].clone().unwrap();
    eventually("broker 3 caught up", || {
        restarted
            .partition(&partition)
            .is_some_and(|p| p.high_watermark() == Offset(60))
    })
    .await;
    let snapshot = restarted.raft(&group).unwrap().metrics().borrow().snapshot;
    assert!(
        snapshot.is_some_and(|s| s.index >= 40),
        "broker 3 installed a snapshot: {snapshot:?}"
    );
    let values = restarted
        .read_partition(&partition, |state, log| {
            state.read(log, Offset(0), 100, u64::MAX).unwrap()
        })
        .unwrap()
        .into_iter()
        .map(|r| String::from_utf8(r.record.value).unwrap())
        .collect::<Vec<_>>();
    assert_eq!(
        values,
        (0..60).map(|i| format!("entry-{i}")).collect::<Vec<_>>()
    );
    for node in nodes.iter().flatten() {
        node.shutdown().await;
    }
}
