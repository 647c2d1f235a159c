//! The node store under power loss: random appends, applies, snapshots,
//! purges and votes on the crash-simulating disk, with crashes at random
//! points (including in the middle of a commit). After every crash the
//! store reopens and:
//! - every log entry openraft was told is persisted is still there (G1),
//!   and so is the last vote that was saved;
//! - the state machine is never behind the purge point, and it agrees with
//!   the log: its records are exactly the applied entries' records from
//!   its log start on (retention entries move it, deleting log entries);
//! - the node keeps working: more appends and applies succeed.

use keel_core::metadata::RetentionPolicy;
use keel_core::partition::PartitionCommand;
use keel_core::record::Record;
use keel_core::{Limits, Offset, TimestampMs};
use keel_server::raft::types::{Command, LogId, Request, TypeConfig, Vote};
use keel_server::storage::crash_disk::NodeDisk;
use keel_server::storage::{GroupStateMachine, LogStore, NodeStore};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::{CommittedLeaderId, Entry, EntryPayload, RaftLogReader, RaftSnapshotBuilder};

const GROUP: &str = "p/t/0";
/// Small segments: runs roll them, and checkpoints remove them, under
/// power loss too.
const SEGMENT_BYTES: u64 = 4 * 1024;

/// splitmix64: the test's only source of choices, from the seed.
struct Choices(u64);

impl Choices {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every seventh entry applies retention (keep about the last 20 records),
/// so the log start moves and log entries are deleted under power loss
/// too; the others append one record, `value-{index}`.
const RETENTION_EVERY: u64 = 7;

/// The furthest log start a check saw: retention must have run.
static RETAINED_AWAY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn entry(index: u64) -> Entry<TypeConfig> {
    let command = if index % RETENTION_EVERY == 0 {
        let keep_bytes = 20 * Record::from_value(format!("value-{index}").into_bytes()).size_bytes();
        PartitionCommand::ApplyRetention { policy: RetentionPolicy { max_age_ms: None, max_bytes: Some(keep_bytes) } }
    } else {
        PartitionCommand::Append {
            producer: None,
            records: vec![Record::from_value(format!("value-{index}").into_bytes())],
        }
    };
    let request = Request::new(TimestampMs(index), Command::Partition(command));
    Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
}

/// What the test has been told is durable.
#[derive(Debug, Default)]
struct Acknowledged {
    /// Highest index openraft would have been told is persisted.
    last_index: u64,
    vote: Option<Vote>,
    /// A vote whose save failed since the last crash: its frame may have
    /// reached the disk, so it may be found instead (as after a crash
    /// between saving a vote and answering with it).
    unanswered_vote: Option<Vote>,
}

struct Opened {
    store: std::sync::Arc<NodeStore>,
    log: LogStore,
    state_machine: GroupStateMachine,
}

fn open(disk: &NodeDisk) -> Opened {
    let store = NodeStore::open_on_disk(disk, SEGMENT_BYTES).expect("the store reopens after a crash");
    let log = LogStore::new(store.clone(), GROUP.to_string());
    let state_machine = GroupStateMachine::open(
        store.clone(),
        GROUP.to_string(),
        GroupStateMachine::initial_partition(Limits::default()),
    )
    .expect("state machine");
    Opened { store, log, state_machine }
}

/// Check the reopened store against what was acknowledged.
async fn check(opened: &mut Opened, acknowledged: &Acknowledged, seed: u64) -> u64 {
    let state = opened.log.get_log_state().await.unwrap();
    let last = state.last_log_id.map_or(0, |l| l.index);
    assert!(
        last >= acknowledged.last_index,
        "seed {seed}: lost acknowledged entries: last {last} < {}",
        acknowledged.last_index
    );
    let purged = state.last_purged_log_id.map_or(0, |l| l.index);
    let entries = opened.log.try_get_log_entries(purged + 1..=last).await.unwrap();
    let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
    assert_eq!(indexes, (purged + 1..=last).collect::<Vec<_>>(), "seed {seed}: log has holes");
    for entry in &entries {
        assert_eq!(entry, &self::entry(entry.log_id.index), "seed {seed}: entry changed");
    }
    let vote = opened.log.read_vote().await.unwrap();
    assert!(
        vote == acknowledged.vote || (vote.is_some() && vote == acknowledged.unanswered_vote),
        "seed {seed}: vote lost: found {vote:?}, saved {:?}",
        acknowledged.vote
    );

    let (applied, _) = opened.state_machine.applied_state().await.unwrap();
    let applied = applied.map_or(0, |l| l.index);
    assert!(applied >= purged, "seed {seed}: state machine at {applied} is behind the purge point {purged}");
    assert!(applied <= last, "seed {seed}: state machine at {applied} is ahead of the log at {last}");
    let records = opened
        .state_machine
        .with_records(|state, reader| {
            RETAINED_AWAY.fetch_max(state.log_start().0, std::sync::atomic::Ordering::Relaxed);
            let appended = applied - applied / RETENTION_EVERY;
            assert_eq!(
                state.high_watermark(),
                Offset(appended),
                "seed {seed}: high watermark disagrees with the entries applied"
            );
            state.read(reader, state.log_start(), 100_000, u64::MAX).unwrap()
        })
        .unwrap()
        .unwrap();
    for record in records {
        // The n-th record (from 0) came from the n-th appending entry.
        let n = record.offset.0;
        let index = n + n / (RETENTION_EVERY - 1) + 1;
        assert_eq!(
            record.record.value,
            format!("value-{index}").into_bytes(),
            "seed {seed}: record disagrees with the log"
        );
    }
    applied
}

async fn run(seed: u64) {
    let mut choices = Choices(seed);
    let mut disk = NodeDisk::new();
    let mut acknowledged = Acknowledged::default();
    let mut opened = open(&disk);
    let mut next_index = 1u64;
    let mut applied = 0u64;
    for _step in 0..40 {
        if choices.below(8) == 0 {
            // Arm a power cut a few writes ahead: it may land mid-commit.
            disk.fail_after_writes(choices.below(6));
        }
        let outcome: Result<(), String> = match choices.below(10) {
            0..=4 => {
                let count = 1 + choices.below(4);
                let entries: Vec<_> = (next_index..next_index + count).map(entry).collect();
                match opened.log.blocking_append(entries).await {
                    Ok(()) => {
                        next_index += count;
                        acknowledged.last_index = next_index - 1;
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            5..=6 if applied + 1 < next_index => {
                let upto = applied + 1 + choices.below(next_index - applied - 1);
                let entries = opened.log.try_get_log_entries(applied + 1..=upto).await.unwrap_or_default();
                match opened.state_machine.apply(entries).await {
                    Ok(_) => {
                        applied = upto;
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            7 if applied > 0 => {
                let mut builder = opened.state_machine.get_snapshot_builder().await;
                match builder.build_snapshot().await {
                    Ok(snapshot) => {
                        let upto = snapshot.meta.last_log_id.unwrap();
                        opened.log.purge(upto).await.map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            8 => {
                let vote = Vote::new(1 + choices.below(5), 1 + choices.below(3));
                match opened.log.save_vote(&vote).await {
                    Ok(()) => {
                        acknowledged.vote = Some(vote);
                        Ok(())
                    }
                    Err(e) => {
                        acknowledged.unanswered_vote = Some(vote);
                        Err(e.to_string())
                    }
                }
            }
            _ => Ok(()),
        };
        let crash_now = outcome.is_err() || disk.is_frozen() || choices.below(6) == 0;
        if crash_now {
            disk = disk.crash(choices.next());
            drop(opened);
            opened = open(&disk);
            applied = check(&mut opened, &acknowledged, seed).await;
            // What was found is what later saves build on.
            acknowledged.vote = opened.log.read_vote().await.unwrap();
            acknowledged.unanswered_vote = None;
            let state = opened.log.get_log_state().await.unwrap();
            next_index = state.last_log_id.map_or(0, |l| l.index) + 1;
        }
    }
    // Finally: pull the power once more and check.
    let disk = disk.crash(choices.next());
    drop(opened);
    let mut opened = open(&disk);
    check(&mut opened, &acknowledged, seed).await;
    let _ = &opened.store;
}

#[test]
fn no_persisted_entry_is_lost_and_state_agrees_with_the_log() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for seed in 0..150 {
        runtime.block_on(run(seed));
    }
    let furthest = RETAINED_AWAY.load(std::sync::atomic::Ordering::Relaxed);
    assert!(furthest > 0, "retention never moved a log start");
}

#[test]
fn a_disk_that_forgets_fsyncs_is_caught() {
    // Negative control: on a disk whose fsync does nothing, the same check
    // must find a lost acknowledged entry or vote.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut caught = 0;
    for seed in 0..40 {
        let result = std::panic::catch_unwind(|| {
            runtime.block_on(async {
                let disk = NodeDisk::new_lying();
                let mut opened = open(&disk);
                let entries: Vec<_> = (1..=3).map(entry).collect();
                opened.log.blocking_append(entries).await.unwrap();
                let acknowledged = Acknowledged { last_index: 3, ..Acknowledged::default() };
                let crashed = disk.crash(seed);
                drop(opened);
                let mut reopened = open(&crashed);
                check(&mut reopened, &acknowledged, seed).await;
            })
        });
        caught += u32::from(result.is_err());
    }
    assert!(caught >= 10, "the lying disk was caught in only {caught} of 40 seeds");
}
