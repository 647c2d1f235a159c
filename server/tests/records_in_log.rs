//! A partition's records are stored once, in the Raft log entries that
//! appended them: reads find them there (batch by batch, skipping rejected
//! batches), a purge for openraft keeps every entry that still holds a
//! retained record, retention deletes the entries it leaves behind, and a
//! replica that installs a snapshot gets the records copied.

use keel_core::metadata::RetentionPolicy;
use keel_core::partition::{AppendBatch, PartitionCommand};
use keel_core::record::{Record, StoredRecord};
use keel_core::{Limits, Offset, TimestampMs};
use keel_server::raft::types::{Command, LogId, Request, Response, TypeConfig};
use keel_server::storage::crash_disk::CrashDisk;
use keel_server::storage::{GroupStateMachine, LogStore, NodeStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, RaftSnapshotBuilder};

const GROUP: &str = "p/t/0";

fn log_id(index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(1, 1), index)
}

fn entry(index: u64, command: PartitionCommand) -> Entry<TypeConfig> {
    let request = Request::new(TimestampMs(1_000 * index), Command::Partition(command));
    Entry { log_id: log_id(index), payload: EntryPayload::Normal(request) }
}

/// Entry `index` appends two batches of two records around an empty batch
/// (refused, so it takes no offsets): values `e{index}-b{batch}-{n}`.
fn appending(index: u64) -> Entry<TypeConfig> {
    let batch = |b: u32| AppendBatch {
        producer: None,
        records: if b == 1 {
            Vec::new()
        } else {
            (0..2).map(|n| Record::from_value(format!("e{index}-b{b}-{n}").into_bytes())).collect()
        },
    };
    entry(index, PartitionCommand::AppendBatches { batches: (0..3).map(batch).collect() })
}

/// Entry `index` applies retention keeping the last `records` records
/// (every record here is 7 bytes).
fn keeping(index: u64, records: u64) -> Entry<TypeConfig> {
    let size = Record::from_value(b"e1-b0-0".to_vec()).size_bytes();
    let policy = RetentionPolicy { max_age_ms: None, max_bytes: Some(records * size) };
    entry(index, PartitionCommand::ApplyRetention { policy })
}

struct Replica {
    store: std::sync::Arc<NodeStore>,
    log: LogStore,
    state_machine: GroupStateMachine,
}

fn replica() -> Replica {
    let store = NodeStore::open_with_backend(CrashDisk::new()).unwrap();
    let log = LogStore::new(store.clone(), GROUP.to_string());
    let state_machine = GroupStateMachine::open(
        store.clone(),
        GROUP.to_string(),
        GroupStateMachine::initial_partition(Limits::default()),
    )
    .unwrap();
    Replica { store, log, state_machine }
}

impl Replica {
    async fn append_and_apply(&mut self, entries: Vec<Entry<TypeConfig>>) -> Vec<Response> {
        self.log.blocking_append(entries.clone()).await.unwrap();
        self.state_machine.apply(entries).await.unwrap()
    }

    fn records(&self) -> (Offset, Vec<StoredRecord>) {
        self.state_machine
            .with_records(|state, reader| {
                (state.log_start(), state.read(reader, state.log_start(), 1000, u64::MAX).unwrap())
            })
            .unwrap()
            .unwrap()
    }

    fn stored(&self, index: u64) -> bool {
        self.store.log_entry_at(GROUP, index).unwrap().0.is_some()
    }
}

fn values(records: &[StoredRecord]) -> Vec<String> {
    records.iter().map(|r| String::from_utf8(r.record.value.clone()).unwrap()).collect()
}

fn expected(entries: std::ops::RangeInclusive<u64>) -> Vec<String> {
    entries.flat_map(|e| [0, 2].into_iter().flat_map(move |b| (0..2).map(move |n| format!("e{e}-b{b}-{n}")))).collect()
}

#[tokio::test]
async fn records_live_in_the_log_until_retention_passes_them() {
    let mut replica = replica();
    replica.append_and_apply((1..=3).map(appending).collect()).await;

    let (start, records) = replica.records();
    assert_eq!(start, Offset(0));
    assert_eq!(values(&records), expected(1..=3));
    let offsets: Vec<u64> = records.iter().map(|r| r.offset.0).collect();
    assert_eq!(offsets, (0..12).collect::<Vec<_>>());
    assert!(records[4..8].iter().all(|r| r.append_time_ms == TimestampMs(2_000)), "entry 2's append time");

    // openraft purges everything: the entries stay, they hold the records.
    replica.log.purge(log_id(3)).await.unwrap();
    assert!((1..=3).all(|i| replica.stored(i)), "purged entries holding retained records are kept");
    let state = replica.log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(3)), Some(log_id(3))));
    assert_eq!(values(&replica.records().1), expected(1..=3));

    // Retention keeps the last 6 records (offsets 6..12). Reads start at
    // 6 at once, but with no snapshot yet every record stays: a first
    // snapshot may be under way with the state from before, and must find
    // its records when it becomes current.
    replica.append_and_apply(vec![keeping(4, 6)]).await;
    let (start, records) = replica.records();
    assert_eq!(start, Offset(6));
    assert_eq!(values(&records), expected(1..=3)[6..].to_vec());
    assert!(replica.stored(1), "no snapshot yet: entry 1 stays");
    assert!(replica.state_machine.snapshot_due_for_retention(start).unwrap(), "a snapshot is asked for");

    // The snapshot starts at offset 6: entry 1 holds none of its records
    // and goes; entry 2 holds offsets 6 and 7.
    replica.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    assert!(!replica.stored(1), "an entry behind retention and the purge point is deleted");
    assert!(replica.stored(2) && replica.stored(3) && replica.stored(4));
    assert!(!replica.state_machine.snapshot_due_for_retention(start).unwrap());
    assert_eq!(values(&replica.records().1), expected(1..=3)[6..].to_vec());

    // A later purge deletes nothing more: the log is kept from the first
    // entry in use on (entries after it, records or not, go with it).
    replica.log.purge(log_id(4)).await.unwrap();
    assert!((2..=4).all(|i| replica.stored(i)), "the log from the first entry in use on stays");
    let state = replica.log.get_log_state().await.unwrap();
    assert_eq!((state.last_purged_log_id, state.last_log_id), (Some(log_id(4)), Some(log_id(4))));
}

#[tokio::test]
async fn a_replica_that_installs_a_snapshot_gets_the_records_copied() {
    let mut leader = replica();
    leader.append_and_apply((1..=3).map(appending).collect()).await;
    let mut builder = leader.state_machine.get_snapshot_builder().await;
    let mut snapshot = builder.build_snapshot().await.unwrap();

    let mut follower = replica();
    let mut incoming = follower.state_machine.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut snapshot.snapshot, &mut incoming).await.unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut incoming).await.unwrap();
    follower.state_machine.install_snapshot(&snapshot.meta, incoming).await.unwrap();
    follower.log.purge(log_id(3)).await.unwrap();
    assert_eq!(values(&follower.records().1), expected(1..=3));

    // The follower appends on in its log; copied and logged records read
    // alike, and retention runs across both.
    follower.append_and_apply(vec![appending(4)]).await;
    assert_eq!(values(&follower.records().1), expected(1..=4));
    follower.append_and_apply(vec![keeping(5, 5)]).await;
    let (start, records) = follower.records();
    assert_eq!(start, Offset(11));
    assert_eq!(values(&records), expected(1..=4)[11..].to_vec());
}

/// A snapshot is only state: the records it covers stay where they are,
/// kept from its log start on while it is current (past retention, since a
/// follower may still need them), and are written into its stream only
/// when it is read.
#[tokio::test]
async fn a_current_snapshot_keeps_its_records_until_a_newer_one_replaces_it() {
    let mut leader = replica();
    leader.append_and_apply((1..=3).map(appending).collect()).await;
    let mut builder = leader.state_machine.get_snapshot_builder().await;
    let first = builder.build_snapshot().await.unwrap();
    leader.log.purge(log_id(3)).await.unwrap();

    leader.append_and_apply(vec![keeping(4, 6)]).await;
    assert_eq!(leader.records().0, Offset(6));
    assert!(leader.stored(1), "the current snapshot still covers entry 1's records");

    // The first snapshot's stream, read now, still has all 12 records.
    let mut follower = replica();
    install(&mut follower, first).await;
    assert_eq!(values(&follower.records().1), expected(1..=3));

    // A newer snapshot starts at offset 6: entry 1 goes, and its stream
    // carries the 6 records kept.
    let mut builder = leader.state_machine.get_snapshot_builder().await;
    let second = builder.build_snapshot().await.unwrap();
    assert!(!leader.stored(1), "no snapshot covers entry 1 any more");
    assert!(leader.stored(2));
    let mut follower = replica();
    install(&mut follower, second).await;
    let (start, records) = follower.records();
    assert_eq!(start, Offset(6));
    assert_eq!(values(&records), expected(1..=3)[6..].to_vec());
}

async fn install(follower: &mut Replica, mut snapshot: openraft::storage::Snapshot<TypeConfig>) {
    let mut incoming = follower.state_machine.begin_receiving_snapshot().await.unwrap();
    tokio::io::copy(&mut snapshot.snapshot, &mut incoming).await.unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut incoming).await.unwrap();
    follower.state_machine.install_snapshot(&snapshot.meta, incoming).await.unwrap();
}

/// Entry `index` appends four records of 100 KiB each.
fn appending_big(index: u64) -> Entry<TypeConfig> {
    let records = (0..4).map(|n| Record::from_value(format!("e{index}-{n}-{}", "x".repeat(100 * 1024)).into_bytes()));
    let batch = AppendBatch { producer: None, records: records.collect() };
    entry(index, PartitionCommand::AppendBatches { batches: vec![batch] })
}

/// A snapshot's stream is written out when a follower first reads it, and
/// the leader may replace that snapshot meanwhile (removing its chunks):
/// the follower still reads it whole. CI once failed with "chunk 0 of
/// snapshot ... is missing" when a removal landed between a write-out's
/// chunks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_replaced_while_it_is_written_out_is_still_read_whole() {
    let mut leader = replica();
    leader.append_and_apply((1..=8).map(appending_big).collect()).await;
    for index in 9..=28 {
        let snapshot = leader.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let reading = tokio::task::spawn_blocking(move || {
            let mut stream = snapshot.snapshot;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut *stream, &mut bytes).map(|_| bytes.len())
        });
        leader.append_and_apply(vec![appending_big(index)]).await;
        leader.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let length = reading.await.unwrap().unwrap_or_else(|e| panic!("snapshot before entry {index}: {e}"));
        let records_then = 4 * (index - 1) as usize;
        assert!(length > records_then * 100 * 1024, "snapshot before entry {index}: {length} bytes");
    }
}

/// Replacing a snapshot while another is written out for a follower does
/// not wait for the write-out (it used to block a tokio worker for the whole
/// write-out); the replaced snapshot's chunks go once the write-out ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replacing_a_snapshot_never_waits_for_a_write_out_and_its_chunks_still_go() {
    let mut leader = replica();
    leader.append_and_apply((1..=4).map(appending_big).collect()).await;
    let first = leader.state_machine.get_snapshot_builder().await.build_snapshot().await.unwrap();
    let first_key = first.snapshot.key().to_string();
    // Read once: written out, its chunks sealed.
    let mut stream = first.snapshot;
    let read = tokio::task::spawn_blocking(move || std::io::Read::read_to_end(&mut *stream, &mut Vec::new()));
    read.await.unwrap().unwrap();
    assert!(keel_server::storage::snapshot_file::is_sealed(&leader.store, &first_key).unwrap());

    // A write-out under way (another follower's), held until told.
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (started, starting) = tokio::sync::oneshot::channel();
    let state_machine = leader.state_machine.clone();
    let write_out = tokio::task::spawn_blocking(move || {
        state_machine.as_write_out(|| {
            started.send(()).unwrap();
            released.recv().unwrap();
        })
    });
    starting.await.unwrap();
    leader.append_and_apply(vec![appending_big(5)]).await;
    let mut builder = leader.state_machine.get_snapshot_builder().await;
    let replacing = tokio::spawn(async move { builder.build_snapshot().await.map(drop) });
    let replaced = tokio::time::timeout(std::time::Duration::from_secs(20), replacing).await;
    // The replaced snapshot's chunks wait for the write-out, then go.
    let kept_meanwhile = keel_server::storage::snapshot_file::is_sealed(&leader.store, &first_key).unwrap();
    let waited = replaced.is_err();
    release.send(()).unwrap();
    assert!(!waited, "building a snapshot waited for a write-out of another");
    replaced.unwrap().unwrap().unwrap();
    assert!(kept_meanwhile, "a replaced snapshot's chunks went during a write-out");
    write_out.await.unwrap().unwrap();
    assert!(!keel_server::storage::snapshot_file::is_sealed(&leader.store, &first_key).unwrap());
}
