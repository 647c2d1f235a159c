//! One database per node or one per group? Appends of 1 KiB entries from
//! many concurrent writers spread over many Raft groups, each write waiting
//! until openraft would be told it is durable.
//!
//! - per node: one redb database, one group-commit flusher: one fsync covers
//!   every group's pending appends.
//! - per group: one database (and flusher) per group: one fsync per group.
//!
//! Run with `cargo bench -p keel-server --bench store`.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_core::partition::PartitionCommand;
use keel_core::record::Record;
use keel_core::TimestampMs;
use keel_server::raft::types::{Command, LogId, Request, TypeConfig};
use keel_server::storage::{LogStore, NodeStore};
use openraft::storage::RaftLogStorageExt;
use openraft::{CommittedLeaderId, Entry, EntryPayload};
use tokio::sync::Mutex;

fn entry(index: u64) -> Entry<TypeConfig> {
    let records = vec![Record::from_value(vec![b'x'; 1024])];
    let request =
        Request::new(TimestampMs(0), Command::Partition(PartitionCommand::Append { producer: None, records }));
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
}

/// `writers` tasks append `appends` entries in all, round-robin over the
/// groups' log stores (each group's appends are serialised, as in Raft).
async fn measure(name: &str, logs: Vec<Arc<Mutex<(LogStore, u64)>>>, writers: usize, appends: u64) {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let logs = logs.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut n = writer as u64;
            while n < appends {
                let log = &logs[(n % logs.len() as u64) as usize];
                let begun = Instant::now();
                {
                    let mut guard = log.lock().await;
                    let (store, next) = &mut *guard;
                    *next += 1;
                    let index = *next;
                    store.blocking_append([entry(index)]).await.expect("append");
                }
                latencies.push(begun.elapsed());
                n += writers as u64;
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for task in tasks {
        latencies.extend(task.await.expect("writer"));
    }
    common::report(name, appends, started.elapsed(), &mut latencies);
}

fn main() {
    let full = common::full_run();
    let (groups, writers, appends) = if full { (16, 64, 20_000) } else { (4, 8, 200) };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async {
        println!("{groups} groups, {writers} concurrent writers, 1 KiB entries, each append waits for its fsync");
        let dir = tempfile::TempDir::new().unwrap();
        let store = NodeStore::open(dir.path()).unwrap();
        let logs =
            (0..groups).map(|g| Arc::new(Mutex::new((LogStore::new(store.clone(), format!("p/t/{g}")), 0)))).collect();
        measure("one database per node (group commit)", logs, writers, appends).await;
        println!("  fsyncs: {}", store.flush_count().unwrap());

        let dirs: Vec<_> = (0..groups).map(|_| tempfile::TempDir::new().unwrap()).collect();
        let mut flushes = Vec::new();
        let logs = dirs
            .iter()
            .enumerate()
            .map(|(g, dir)| {
                let store = NodeStore::open(dir.path()).unwrap();
                flushes.push(store.clone());
                Arc::new(Mutex::new((LogStore::new(store, format!("p/t/{g}")), 0)))
            })
            .collect();
        measure("one database per group", logs, writers, appends).await;
        println!("  fsyncs: {}", flushes.iter().map(|s| s.flush_count().unwrap()).sum::<u64>());
    });
}
