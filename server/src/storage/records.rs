//! Partition records in the node's database, as keel-core's `RecordLog`.
//!
//! The Raft log is the partition log: a record is stored once, inside the
//! log entry that appended it (a frame of the node's segment log). The state machine keeps only an index of
//! runs (`RECORD_RUNS`): each row says that offsets `[base, base + count)`
//! are the records of the entry at `log_index` from record `first` of batch
//! `batch` on, in the entry's order (a run may go on into the following
//! batches: one row for an entry of many one-record produce requests, not
//! one per request). A
//! replica that installed a snapshot has no such entries; the records it
//! received are copied into `RECORDS` and indexed by a `Copied` run.
//!
//! So the log may be purged (for openraft) only behind the first entry
//! that still holds a retained record: `LogStore::purge` and retention
//! (`remove_before`) each delete log rows only below both bounds. The
//! current snapshot is only state: the records it covers are kept (from
//! its log start on) until a newer snapshot replaces it, and are written
//! into its stream only when a follower needs it.

use std::cell::RefCell;

use keel_core::partition::{PartitionCommand, RecordLog, RecordPlace};
use keel_core::record::{Record, StoredRecord};
use keel_core::{Offset, TimestampMs};
use openraft::EntryPayload;
use redb::{ReadOnlyTable, ReadableTable, Table};
use serde::{Deserialize, Serialize};

use super::segments::SegmentReader;
use super::state_machine::CurrentSnapshot;
use super::store::{read_entry, LogRow, StoreError, LOG, RAFT_META, RECORDS, RECORD_RUNS, SNAPSHOTS};
use crate::raft::types::{Command, LogId};

type KeyedTable<'txn> = Table<'txn, (&'static str, u64), &'static [u8]>;
type ReadOnlyKeyed = ReadOnlyTable<(&'static str, u64), &'static [u8]>;

/// Where a run of consecutive offsets is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Run {
    /// `count` records of the log entry at `log_index`, from record `first`
    /// of batch `batch` on in the entry's order (on into the next batches
    /// past the end of this one), all appended at `append_time_ms`. A run
    /// never spans a record that was not appended (a rejected or duplicate
    /// batch ends it).
    InLog { log_index: u64, batch: u32, first: u32, count: u64, append_time_ms: TimestampMs },
    /// `count` records copied into `RECORDS` (received in a snapshot).
    Copied { count: u64 },
}

impl Run {
    fn count(&self) -> u64 {
        match self {
            Run::InLog { count, .. } | Run::Copied { count } => *count,
        }
    }

    /// The same run without its first `skip` records.
    fn skip(self, skip: u64) -> Run {
        match self {
            Run::InLog { log_index, batch, first, count, append_time_ms } => Run::InLog {
                log_index,
                batch,
                // `skip < count`, and an entry holds far fewer than
                // `u32::MAX` records (it is at most `ENTRY_BYTES_MAX` and
                // a message's limit).
                first: first.saturating_add(u32::try_from(skip).unwrap_or(u32::MAX)),
                count: count - skip,
                append_time_ms,
            },
            Run::Copied { count } => Run::Copied { count: count - skip },
        }
    }
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, StoreError> {
    Ok(postcard::from_bytes(bytes)?)
}

/// The run holding `offset`, as `(base, run)`, if any.
fn run_at(
    runs: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    group: &str,
    offset: Offset,
) -> Result<Option<(Offset, Run)>, StoreError> {
    let Some(row) = runs.range((group, 0)..=(group, offset.0))?.next_back() else { return Ok(None) };
    let (key, value) = row.map_err(redb::Error::from)?;
    let base = Offset(key.value().1);
    let run: Run = decode(value.value())?;
    Ok((offset.0 - base.0 < run.count()).then_some((base, run)))
}

/// The log index of the first entry that still holds a record of `group`
/// (`u64::MAX` if none does): the log must be kept from there on.
pub(crate) fn first_log_index_in_use(
    runs: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    group: &str,
) -> Result<u64, StoreError> {
    // Copied runs (from a snapshot) come before every run in the log.
    for row in runs.range((group, 0)..=(group, u64::MAX))? {
        let (_, value) = row.map_err(redb::Error::from)?;
        if let Run::InLog { log_index, .. } = decode(value.value())? {
            return Ok(log_index);
        }
    }
    Ok(u64::MAX)
}

/// The records of every batch of one log entry, decoded once and kept for
/// the next record of the same entry.
#[derive(Debug, Default)]
struct EntryCache {
    entry: Option<(u64, Vec<Vec<Record>>)>,
}

impl EntryCache {
    fn record(
        &mut self,
        log: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
        segments: &SegmentReader,
        group: &str,
        log_index: u64,
        batch: u32,
        position: u32,
    ) -> Result<Record, StoreError> {
        let batches = self.load(log, segments, group, log_index)?;
        // A run goes on into the next batches: record `position` counted
        // from the start of batch `batch`, in the entry's order.
        let mut left = position as usize;
        for records in batches.iter().skip(batch as usize) {
            if let Some(record) = records.get(left) {
                return Ok(record.clone());
            }
            left -= records.len();
        }
        Err(StoreError::Inconsistent(format!(
            "{group}'s log entry {log_index} has no record {position} from batch {batch} on"
        )))
    }

    /// The sizes of `count` records of entry `log_index` from record
    /// `position` of batch `batch` on (as [`EntryCache::record`] counts),
    /// each pushed onto `sizes` with `append_time_ms`; no record copied.
    #[allow(clippy::too_many_arguments)]
    fn sizes(
        &mut self,
        log: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
        segments: &SegmentReader,
        group: &str,
        log_index: u64,
        (batch, position, count): (u32, u32, u64),
        append_time_ms: TimestampMs,
        sizes: &mut Vec<(TimestampMs, u64)>,
    ) -> Result<(), StoreError> {
        let batches = self.load(log, segments, group, log_index)?;
        let found = batches
            .iter()
            .skip(batch as usize)
            .flatten()
            .skip(position as usize)
            .take(usize::try_from(count).unwrap_or(usize::MAX))
            .map(|record| sizes.push((append_time_ms, record.size_bytes())))
            .count();
        if found as u64 != count {
            return Err(StoreError::Inconsistent(format!(
                "{group}'s log entry {log_index} has fewer than {count} records from record {position} of batch {batch} on"
            )));
        }
        Ok(())
    }

    /// The batches of records of entry `log_index`, decoded once.
    fn load(
        &mut self,
        log: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
        segments: &SegmentReader,
        group: &str,
        log_index: u64,
    ) -> Result<&Vec<Vec<Record>>, StoreError> {
        if self.entry.as_ref().is_none_or(|(index, _)| *index != log_index) {
            let Some(value) = log.get((group, log_index))? else {
                return Err(StoreError::Inconsistent(format!(
                    "{group}'s record index points at log entry {log_index}, which is not stored"
                )));
            };
            let row: LogRow = decode(value.value())?;
            let entry = read_entry(segments, &row)?;
            let batches = match entry.payload {
                // Just decoded: the command is not shared.
                EntryPayload::Normal(request) => match std::sync::Arc::unwrap_or_clone(request.command) {
                    Command::Partition(PartitionCommand::Append { records, .. }) => vec![records],
                    Command::Partition(PartitionCommand::AppendBatches { batches }) => {
                        batches.into_iter().map(|b| b.records).collect()
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            self.entry = Some((log_index, batches));
        }
        Ok(&self.entry.as_ref().expect("just filled").1)
    }
}

/// The run holding an offset, with its base offset, if any.
type RunAt = Result<Option<(Offset, Run)>, StoreError>;

/// Where a partition's records are read from: the run index (`run_at`
/// finds the run holding an offset), records copied from a snapshot, and
/// the log entries that runs point into.
struct Stored<'a, R, C, L> {
    run_at: R,
    copies: &'a C,
    log: &'a L,
    segments: &'a SegmentReader,
    group: &'a str,
}

impl<R, C, L> Stored<'_, R, C, L>
where
    R: Fn(Offset) -> RunAt,
    C: ReadableTable<(&'static str, u64), &'static [u8]>,
    L: ReadableTable<(&'static str, u64), &'static [u8]>,
{
    /// The record at `offset`.
    fn record(&self, cache: &mut EntryCache, offset: Offset) -> Result<Option<StoredRecord>, StoreError> {
        match (self.run_at)(offset)? {
            None => Ok(None),
            Some((base, Run::InLog { log_index, batch, first, append_time_ms, .. })) => {
                // Within the run: `offset - base < count`, which fits a batch.
                let position = first + (offset.0 - base.0) as u32;
                let record = cache.record(self.log, self.segments, self.group, log_index, batch, position)?;
                Ok(Some(StoredRecord { offset, append_time_ms, record }))
            }
            Some((_, Run::Copied { .. })) => {
                let value = self.copies.get((self.group, offset.0))?;
                value.map(|v| decode(v.value())).transpose()
            }
        }
    }

    /// What [`RecordLog::sizes_from`] answers, run by run: one index
    /// lookup per run, not per record, and no record copied.
    fn sizes_from(
        &self,
        cache: &mut EntryCache,
        offset: Offset,
        max: u64,
    ) -> Result<Vec<(TimestampMs, u64)>, StoreError> {
        let mut sizes = Vec::new();
        let mut at = offset;
        while (sizes.len() as u64) < max {
            let Some((base, run)) = (self.run_at)(at)? else { break };
            let skip = at.0 - base.0;
            let take = (run.count() - skip).min(max - sizes.len() as u64);
            match run {
                Run::InLog { log_index, batch, first, append_time_ms, .. } => {
                    // Within the run: `skip < count`, which fits a batch.
                    let place = (batch, first + skip as u32, take);
                    cache.sizes(self.log, self.segments, self.group, log_index, place, append_time_ms, &mut sizes)?;
                }
                Run::Copied { .. } => {
                    for copied in at.0..at.0 + take {
                        let Some(value) = self.copies.get((self.group, copied))? else { return Ok(sizes) };
                        let stored: StoredRecord = decode(value.value())?;
                        sizes.push((stored.append_time_ms, stored.record.size_bytes()));
                    }
                }
            }
            at = Offset(at.0 + take);
        }
        Ok(sizes)
    }
}

/// The last purged log index of `group`, if any.
fn purged_index(txn: &redb::WriteTransaction, group: &str) -> Result<Option<u64>, StoreError> {
    let meta = txn.open_table(RAFT_META)?;
    let purged: Option<LogId> = meta.get((group, "purged"))?.map(|v| decode(v.value())).transpose()?;
    Ok(purged.map(|p| p.index))
}

/// Delete `group`'s log rows that openraft has purged and that hold no
/// retained record (`runs` is the run index, open in `txn`).
pub(crate) fn delete_unused_log(
    txn: &redb::WriteTransaction,
    runs: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
    group: &str,
) -> Result<(), StoreError> {
    let Some(purged) = purged_index(txn, group)? else { return Ok(()) };
    let end = first_log_index_in_use(runs, group)?.min(purged.saturating_add(1));
    super::log_rows::delete_rows(txn, group, 0..end)
}

/// Records of one partition inside the writer's transaction (used by
/// apply). Call [`RecordWriter::entry`] before each entry is applied and
/// [`RecordWriter::finish`] after the last.
pub struct RecordWriter<'a, 'txn> {
    txn: &'txn redb::WriteTransaction,
    runs: KeyedTable<'txn>,
    segments: SegmentReader,
    group: &'a str,
    /// The log index of the entry being applied.
    log_index: u64,
    /// Where each batch of the entry being applied starts, counted in
    /// records from the entry's first: a run goes on across batches only
    /// where no record between was left out.
    batch_starts: Vec<u64>,
    /// The run being extended, not yet written: `(base, run)`.
    pending: Option<(Offset, Run)>,
    cache: RefCell<EntryCache>,
}

impl<'a, 'txn> RecordWriter<'a, 'txn> {
    pub(crate) fn new(
        txn: &'txn redb::WriteTransaction,
        segments: SegmentReader,
        group: &'a str,
    ) -> Result<Self, StoreError> {
        Ok(RecordWriter {
            txn,
            runs: txn.open_table(RECORD_RUNS)?,
            segments,
            group,
            log_index: 0,
            batch_starts: Vec::new(),
            pending: None,
            cache: RefCell::default(),
        })
    }

    /// The partition command applied next is `command`, at `log_index`.
    pub(crate) fn entry(&mut self, log_index: u64, command: &PartitionCommand) -> Result<(), StoreError> {
        self.flush()?;
        self.log_index = log_index;
        self.batch_starts.clear();
        let mut start = 0u64;
        let mut starts_at = |records: usize| {
            self.batch_starts.push(start);
            start += records as u64;
        };
        match command {
            PartitionCommand::Append { records, .. } => starts_at(records.len()),
            PartitionCommand::AppendBatches { batches } => batches.iter().for_each(|b| starts_at(b.records.len())),
            _ => {}
        }
        Ok(())
    }

    /// Where a record sits in the entry being applied, counted in records
    /// from the entry's first (`None`: a place the entry does not have).
    fn in_entry(&self, batch: u32, position: u32) -> Option<u64> {
        self.batch_starts.get(batch as usize).map(|start| start + u64::from(position))
    }

    /// Write the pending run.
    pub(crate) fn finish(mut self) -> Result<(), StoreError> {
        self.flush()
    }

    /// Where this partition's records are read from, given `copies` and
    /// `log` open in the writer's transaction: the run not yet written to
    /// the index counts as if it were.
    fn stored<'s, C, L>(&'s self, copies: &'s C, log: &'s L) -> Stored<'s, impl Fn(Offset) -> RunAt + 's, C, L> {
        let run_at = move |at: Offset| match self.pending {
            Some((base, run)) if at >= base && at.0 - base.0 < run.count() => Ok(Some((base, run))),
            _ => run_at(&self.runs, self.group, at),
        };
        Stored { run_at, copies, log, segments: &self.segments, group: self.group }
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        if let Some((base, run)) = self.pending.take() {
            self.runs.insert((self.group, base.0), postcard::to_stdvec(&run)?.as_slice())?;
        }
        Ok(())
    }
}

impl RecordLog for RecordWriter<'_, '_> {
    type Error = StoreError;

    fn append(
        &mut self,
        offset: Offset,
        append_time_ms: TimestampMs,
        _record: &Record,
        place: RecordPlace,
    ) -> Result<(), StoreError> {
        let here = self.in_entry(place.batch, place.position);
        let pending_start = match &self.pending {
            Some((_, Run::InLog { batch, first, .. })) => self.in_entry(*batch, *first),
            _ => None,
        };
        if let Some((base, Run::InLog { log_index, count, append_time_ms: time, .. })) = &mut self.pending {
            let continues = *log_index == self.log_index
                && pending_start.zip(here).is_some_and(|(start, here)| start + *count == here)
                && base.0 + *count == offset.0
                && *time == append_time_ms;
            if continues {
                *count += 1;
                return Ok(());
            }
        }
        self.flush()?;
        let run = Run::InLog {
            log_index: self.log_index,
            batch: place.batch,
            first: place.position,
            count: 1,
            append_time_ms,
        };
        self.pending = Some((offset, run));
        Ok(())
    }

    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, StoreError> {
        let (copies, log) = (self.txn.open_table(RECORDS)?, self.txn.open_table(LOG)?);
        let found = self.stored(&copies, &log).record(&mut self.cache.borrow_mut(), offset);
        found
    }

    fn sizes_from(&self, offset: Offset, max: u64) -> Result<Vec<(TimestampMs, u64)>, StoreError> {
        let (copies, log) = (self.txn.open_table(RECORDS)?, self.txn.open_table(LOG)?);
        let found = self.stored(&copies, &log).sizes_from(&mut self.cache.borrow_mut(), offset, max);
        found
    }

    fn remove_before(&mut self, offset: Offset) -> Result<(), StoreError> {
        self.flush()?;
        // The current snapshot keeps its records (a follower may need them)
        // until a newer snapshot replaces it. With none yet, every record
        // stays: the first snapshot may be under way with the state it read
        // before this retention, and when it becomes current it must find
        // the records from that state's log start on (sim seed 170000193).
        // `snapshot_due_for_retention` asks for that snapshot, whose
        // `make_current` then lets the records behind it go.
        let kept = CurrentSnapshot::read(&self.txn.open_table(SNAPSHOTS)?, self.group)?
            .map_or(0, |snapshot| snapshot.records_from);
        forget_runs_before(self.txn, &mut self.runs, self.group, Offset(offset.0.min(kept)))
    }
}

/// Delete `group`'s records below `offset`: their runs (a run across
/// `offset` is cut), their copies, and the log entries that then hold no
/// record (if purged).
pub(crate) fn forget_before(txn: &redb::WriteTransaction, group: &str, offset: Offset) -> Result<(), StoreError> {
    forget_runs_before(txn, &mut txn.open_table(RECORD_RUNS)?, group, offset)
}

fn forget_runs_before(
    txn: &redb::WriteTransaction,
    runs: &mut KeyedTable<'_>,
    group: &str,
    offset: Offset,
) -> Result<(), StoreError> {
    if let Some((base, run)) = run_at(runs, group, offset)? {
        if base < offset {
            runs.remove((group, base.0))?;
            let rest = run.skip(offset.0 - base.0);
            runs.insert((group, offset.0), postcard::to_stdvec(&rest)?.as_slice())?;
        }
    }
    runs.retain_in((group, 0)..(group, offset.0), |_, _| false)?;
    txn.open_table(RECORDS)?.retain_in((group, 0)..(group, offset.0), |_, _| false)?;
    delete_unused_log(txn, runs, group)
}

/// Records of one partition in a read transaction (used by reads).
pub struct RecordReader<'a> {
    runs: ReadOnlyKeyed,
    copies: ReadOnlyKeyed,
    log: ReadOnlyKeyed,
    segments: SegmentReader,
    group: &'a str,
    cache: RefCell<EntryCache>,
}

impl<'a> RecordReader<'a> {
    pub(crate) fn new(
        txn: &redb::ReadTransaction,
        segments: SegmentReader,
        group: &'a str,
    ) -> Result<Self, StoreError> {
        Ok(RecordReader {
            runs: txn.open_table(RECORD_RUNS)?,
            copies: txn.open_table(RECORDS)?,
            log: txn.open_table(LOG)?,
            segments,
            group,
            cache: RefCell::default(),
        })
    }

    /// Where this partition's records are read from.
    fn stored(&self) -> Stored<'_, impl Fn(Offset) -> RunAt + '_, ReadOnlyKeyed, ReadOnlyKeyed> {
        let run_at = |at: Offset| run_at(&self.runs, self.group, at);
        Stored { run_at, copies: &self.copies, log: &self.log, segments: &self.segments, group: self.group }
    }
}

impl RecordLog for RecordReader<'_> {
    type Error = StoreError;

    fn append(&mut self, _: Offset, _: TimestampMs, _: &Record, _: RecordPlace) -> Result<(), StoreError> {
        Err(StoreError::ReadOnly)
    }

    fn get(&self, offset: Offset) -> Result<Option<StoredRecord>, StoreError> {
        self.stored().record(&mut self.cache.borrow_mut(), offset)
    }

    fn sizes_from(&self, offset: Offset, max: u64) -> Result<Vec<(TimestampMs, u64)>, StoreError> {
        self.stored().sizes_from(&mut self.cache.borrow_mut(), offset, max)
    }

    fn remove_before(&mut self, _offset: Offset) -> Result<(), StoreError> {
        Err(StoreError::ReadOnly)
    }
}

/// Replace `group`'s records with those of a snapshot, copied (inside the
/// writer's transaction): `records` in offset order.
pub(crate) fn replace_with_copies(
    txn: &redb::WriteTransaction,
    group: &str,
    mut next_record: impl FnMut() -> Result<Option<StoredRecord>, StoreError>,
) -> Result<(), StoreError> {
    let mut runs = txn.open_table(RECORD_RUNS)?;
    let mut copies = txn.open_table(RECORDS)?;
    runs.retain_in((group, 0)..=(group, u64::MAX), |_, _| false)?;
    copies.retain_in((group, 0)..=(group, u64::MAX), |_, _| false)?;
    let mut run: Option<(Offset, u64)> = None;
    while let Some(record) = next_record()? {
        copies.insert((group, record.offset.0), postcard::to_stdvec(&record)?.as_slice())?;
        run = match run {
            Some((base, count)) if base.0 + count == record.offset.0 => Some((base, count + 1)),
            Some((base, count)) => {
                runs.insert((group, base.0), postcard::to_stdvec(&Run::Copied { count })?.as_slice())?;
                Some((record.offset, 1))
            }
            None => Some((record.offset, 1)),
        };
    }
    if let Some((base, count)) = run {
        runs.insert((group, base.0), postcard::to_stdvec(&Run::Copied { count })?.as_slice())?;
    }
    Ok(())
}

/// A data directory of an older keel kept every record in `RECORDS` and no
/// runs: index those copies, once, when the group opens.
pub(crate) fn index_copies_of_older_versions(
    store: &super::store::NodeStore,
    group: &str,
    log_start: Offset,
    high_watermark: Offset,
) -> Result<(), StoreError> {
    if log_start >= high_watermark {
        return Ok(());
    }
    let unindexed = store.read(|txn| {
        let no_runs = txn.open_table(RECORD_RUNS)?.range((group, 0)..=(group, u64::MAX))?.next().is_none();
        Ok(no_runs && txn.open_table(RECORDS)?.get((group, log_start.0))?.is_some())
    })?;
    if unindexed {
        let run = postcard::to_stdvec(&Run::Copied { count: high_watermark.0 - log_start.0 })?;
        // Not durable: outside the writer a durable commit would make the
        // writer's unsynced deletions durable without moving the log's
        // checkpoint (a replay could then bring purged rows back). Lost in
        // a crash, the index is simply made again at the next open.
        store.write_now(false, |txn| {
            txn.open_table(RECORD_RUNS)?.insert((group, log_start.0), run.as_slice())?;
            Ok(())
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use keel_core::metadata::RetentionPolicy;
    use keel_core::partition::{AppendBatch, ProducerBatch};
    use keel_core::{Limits, ProducerId, Sequence};
    use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
    use openraft::{CommittedLeaderId, Entry};

    use super::*;
    use crate::raft::types::{Request, TypeConfig};
    use crate::storage::crash_disk::CrashDisk;
    use crate::storage::{GroupStateMachine, LogStore, NodeStore};

    const GROUP: &str = "p/t/0";

    /// A store with one partition group's log and state machine.
    fn partition() -> (std::sync::Arc<NodeStore>, LogStore, GroupStateMachine) {
        let store = NodeStore::open_with_backend(CrashDisk::new()).unwrap();
        let log = LogStore::new(store.clone(), GROUP.to_string());
        let state_machine = GroupStateMachine::open(
            store.clone(),
            GROUP.to_string(),
            GroupStateMachine::initial_partition(Limits::default()),
        )
        .unwrap();
        (store, log, state_machine)
    }

    /// Append `command`, stamped `at`, as log entry `index` (term 1), and
    /// apply it.
    async fn append_and_apply(
        log: &mut LogStore,
        state_machine: &mut GroupStateMachine,
        index: u64,
        at: TimestampMs,
        command: PartitionCommand,
    ) {
        let request = Request::new(at, Command::Partition(command));
        let entry: Entry<TypeConfig> =
            Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) };
        log.blocking_append(vec![entry.clone()]).await.unwrap();
        state_machine.apply(vec![entry]).await.unwrap();
    }

    /// An entry of one-record produce requests (as a leader coalesces them)
    /// is indexed by one run, not one per request, up to a request that is
    /// not appended (here a producer's retry, answered as a duplicate); its
    /// records read back in order across the batches.
    #[tokio::test]
    async fn one_record_requests_of_an_entry_share_a_run_until_one_is_left_out() {
        let (store, mut log, mut state_machine) = partition();
        let producer = ProducerBatch { producer: ProducerId(7), sequence: Sequence(0) };
        let batches = (0..8)
            .map(|b| AppendBatch {
                producer: [1, 3].contains(&b).then_some(producer),
                records: vec![Record::from_value(format!("b{b}").into_bytes())],
            })
            .collect();
        let command = PartitionCommand::AppendBatches { batches };
        append_and_apply(&mut log, &mut state_machine, 1, TimestampMs(5), command).await;

        let runs: Vec<(u64, Run)> = store
            .read(|txn| {
                let table = txn.open_table(RECORD_RUNS)?;
                let mut runs = Vec::new();
                for row in table.range((GROUP, 0)..=(GROUP, u64::MAX))? {
                    let (key, value) = row.map_err(redb::Error::from)?;
                    runs.push((key.value().1, decode(value.value())?));
                }
                Ok(runs)
            })
            .unwrap();
        let in_log = |batch, count| Run::InLog { log_index: 1, batch, first: 0, count, append_time_ms: TimestampMs(5) };
        assert_eq!(runs, vec![(0, in_log(0, 3)), (3, in_log(4, 4))]);

        let values = state_machine
            .with_records(|state, reader| state.read(reader, Offset(0), 100, u64::MAX).unwrap())
            .unwrap()
            .unwrap();
        let values: Vec<(u64, String)> =
            values.iter().map(|r| (r.offset.0, String::from_utf8(r.record.value.clone()).unwrap())).collect();
        let expected: Vec<(u64, String)> = ["b0", "b1", "b2", "b4", "b5", "b6", "b7"]
            .iter()
            .enumerate()
            .map(|(o, v)| (o as u64, v.to_string()))
            .collect();
        assert_eq!(values, expected);
    }

    /// Retention reads sizes run by run; they must be what reading each
    /// record gives (the trait's default), from any offset, for any count,
    /// across runs, batches, entries and a duplicate left out; and a
    /// retention by bytes applied through them lands where reading each
    /// record would.
    #[tokio::test]
    async fn sizes_read_by_run_are_those_of_each_record() {
        let (_store, mut log, mut state_machine) = partition();
        let producer = |sequence| Some(ProducerBatch { producer: ProducerId(7), sequence: Sequence(sequence) });
        let mut sequence = 0;
        for index in 1..=3u64 {
            let batches = (0..5u64)
                .map(|b| {
                    // Batch 2 of entry 2 repeats the previous sequence: a
                    // duplicate, not appended, so its run ends there.
                    let retry = index == 2 && b == 2;
                    if !retry {
                        sequence += 1;
                    }
                    AppendBatch {
                        producer: producer(sequence - 1),
                        records: (0..=b)
                            .map(|r| Record::from_value(vec![b as u8; (10 * index + r) as usize]))
                            .collect(),
                    }
                })
                .collect();
            let command = PartitionCommand::AppendBatches { batches };
            append_and_apply(&mut log, &mut state_machine, index, TimestampMs(index), command).await;
        }
        let (stored, checked) = state_machine
            .with_records(|state, reader| {
                let high = state.high_watermark().0;
                let each = |from: u64, max: u64| -> Vec<(TimestampMs, u64)> {
                    (from..high)
                        .take(max as usize)
                        .map(|o| reader.get(Offset(o)).unwrap().unwrap())
                        .map(|r| (r.append_time_ms, r.record.size_bytes()))
                        .collect()
                };
                let mut checked = 0;
                for from in 0..=high {
                    for max in [1, 2, 3, 7, 100] {
                        assert_eq!(
                            reader.sizes_from(Offset(from), max).unwrap(),
                            each(from, max),
                            "from {from}, {max}"
                        );
                        checked += 1;
                    }
                }
                (each(0, high), checked)
            })
            .unwrap()
            .unwrap();
        assert!(stored.len() > 30 && checked > 150, "{} records", stored.len());

        // Retention by bytes: keep at most half of them.
        let total: u64 = stored.iter().map(|(_, size)| size).sum();
        let max = total / 2;
        let (mut bytes, mut expected_start) = (total, 0u64);
        for (_, size) in &stored {
            if bytes <= max {
                break;
            }
            bytes -= size;
            expected_start += 1;
        }
        let policy = RetentionPolicy { max_age_ms: None, max_bytes: Some(max) };
        let command = PartitionCommand::ApplyRetention { policy };
        append_and_apply(&mut log, &mut state_machine, 4, TimestampMs(9), command).await;
        let (log_start, log_bytes) =
            state_machine.with_records(|state, _| (state.log_start().0, state.log_bytes())).unwrap().unwrap();
        assert_eq!((log_start, log_bytes), (expected_start, bytes));
    }
}
