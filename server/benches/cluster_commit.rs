//! Commit throughput and latency of one partition replicated on three
//! brokers, on real tokio over loopback, 1 KiB records.
//!
//! - batching on: each Raft entry carries a batch of records (as an
//!   idempotent producer sends them), and concurrent entries share fsyncs
//!   through the node's group commit;
//! - single record per entry: the same records, one Raft entry each.
//!
//! An append counts as committed when the leader's state machine applied it
//! (after a majority fsynced it). Each proposal goes to whichever broker
//! leads at the time (non-leaders refuse at once), so an election under load
//! costs latency, not the run. Run with
//! `cargo bench -p keel-server --bench cluster_commit`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::metadata::{MetadataCommand, RetentionPolicy};
use keel_core::partition::PartitionCommand;
use keel_core::record::Record;
use keel_core::{PartitionIndex, TopicName, TopicPartition};
use keel_server::group::GroupId;
use keel_server::local_cluster::LocalCluster;
use keel_server::raft::types::{Command, Response};

const DEADLINE: Duration = Duration::from_secs(30);

/// `writers` concurrent proposers send `records` records in all, `batch`
/// records per Raft entry, to the leader.
async fn measure(name: &str, cluster: Arc<LocalCluster>, group: GroupId, writers: u64, records: u64, batch: u64) {
    let entries = records / batch;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let (cluster, group) = (cluster.clone(), group.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = writer;
            while n < entries {
                let records = (0..batch).map(|_| Record::from_value(vec![b'x'; 1024])).collect();
                let command = Command::Partition(PartitionCommand::Append { producer: None, records });
                let begun = Instant::now();
                // Through elections, ask whoever leads now.
                let response = cluster.propose(&group, command, DEADLINE).await.expect("commit");
                assert!(matches!(response, Response::Partition(Ok(_))), "{response:?}");
                // Every record of the batch waited this long.
                latencies.extend((0..batch).map(|_| begun.elapsed()));
                n += writers;
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("writer"));
    }
    common::report(name, entries * batch, started.elapsed(), &mut latencies);
}

fn main() {
    let full = common::full_run();
    let records = if full { 40_000 } else { 256 };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        let dir = tempfile::TempDir::new().unwrap();
        let cluster = LocalCluster::start(dir.path().to_path_buf(), 3, |_| {}).await.unwrap();
        cluster
            .eventually("brokers registered", DEADLINE, |c| c.node(1).unwrap().metadata().brokers().len() == 3)
            .await
            .unwrap();
        let create = MetadataCommand::CreateTopic {
            topic: "bench".into(),
            partitions: 1,
            replication_factor: 3,
            retention: RetentionPolicy::default(),
        };
        cluster.propose(&GroupId::Metadata, Command::Metadata(create), DEADLINE).await.unwrap();
        let partition = TopicPartition::new(TopicName::new("bench").unwrap(), PartitionIndex(0));
        cluster
            .eventually("topic known", DEADLINE, |c| c.node(1).unwrap().partition_group(&partition).is_some())
            .await
            .unwrap();
        let group = cluster.node(1).unwrap().partition_group(&partition).unwrap();
        cluster
            .eventually("partition on every broker", DEADLINE, |c| c.live().all(|n| n.groups().contains(&group)))
            .await
            .unwrap();
        // Warm up and find the leader.
        cluster
            .propose(
                &group,
                Command::Partition(PartitionCommand::Append {
                    producer: None,
                    records: vec![Record::from_value(b"warm".to_vec())],
                }),
                DEADLINE,
            )
            .await
            .unwrap();
        let cluster = Arc::new(cluster);

        println!("3 brokers on loopback, 1 partition, replication 3, 1 KiB records, {records} records per run");
        measure("batching on: 64 records per entry, 8 writers", cluster.clone(), group.clone(), 8, records, 64).await;
        measure("single record per entry, 64 writers", cluster.clone(), group.clone(), 64, records / 4, 1).await;
        measure("single record per entry, 1 writer", cluster.clone(), group, 1, records / 40, 1).await;
        if let Ok(mut cluster) = Arc::try_unwrap(cluster) {
            cluster.shutdown().await;
        }
    });
}
