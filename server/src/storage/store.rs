//! The node's storage: its redb database, its segment log, and the writer
//! that commits to both (group commit across every Raft group).
//!
//! Raft log entries (and so partition records) are frames of the segment
//! log; redb holds votes, state rows and, per entry, a `LOG` row saying
//! where its frame is. A batch of the writer appends its frames, writes
//! them out (when entries wait to be reported persisted, syncs the segment
//! log only, one `fdatasync`, and reports them), then commits its redb
//! transaction without fsync, if it has anything to write. Every so often ([`CHECKPOINT_BYTES`],
//! [`CHECKPOINT_BATCHES`]), and whenever a write asks for durability, the
//! transaction is committed durably with the log's position: the
//! checkpoint. A vote is a frame too, synced like an entry, so saving one
//! costs an `fdatasync`, not a checkpoint. After a crash redb is back at
//! its last checkpoint and the frames after it are replayed into `LOG`
//! and `RAFT_META`; rows whose frames were lost (never reported persisted)
//! are deleted.
//!
//! Reclaiming space: `SEGMENT_LIVE` counts, in the rows' transaction, the
//! bytes of live frames per segment ([`super::log_rows`]). A segment no
//! row points into at a checkpoint is removed once every reader that
//! pinned an older view is gone ([`super::segments::Pin`]). A segment at
//! most half live is compacted: checkpoint by checkpoint its live frames
//! are copied, byte for byte, to the end of the log and their rows point
//! at the copies, so one quiet group cannot keep a busy group's dead
//! frames on disk.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::LogFlushed;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::ledger::{Ledger, MarkChange};
use super::log_rows::{self, SEGMENT_LIVE};
use super::log_tail::NodeTailBytes;
use super::segments::{DirectoryDisk, Location, Pin, Position, SegmentDisk, SegmentError, SegmentLog, SegmentReader};
use crate::raft::types::{LogId, TypeConfig, Vote};

/// Raft log entries: (group key, log index) -> postcard(LogRow), where the
/// entry's frame is in the segment log.
pub(crate) const LOG: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("raft_log");
/// The segment log's checkpoint: "checkpoint" -> postcard(Position).
const SEGMENT_LOG: TableDefinition<&str, &[u8]> = TableDefinition::new("segment_log");
/// Raft metadata: (group key, "vote" | "purged" | "committed") -> postcard.
pub(crate) const RAFT_META: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("raft_meta");
/// The `RAFT_META` name of a group's vote.
pub(crate) const VOTE: &str = "vote";
/// `RAFT_META`'s key for a group's commit index hint.
pub(crate) const COMMITTED: &str = "committed";
/// State machines: group key -> postcard(Applied).
pub(crate) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state_machine");
/// Partition records received in a snapshot (the others stay in their log
/// entries): (group key, offset) -> postcard(StoredRecord).
pub(crate) const RECORDS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("records");
/// Where each run of a partition's offsets is stored: (group key, first
/// offset) -> postcard(records::Run).
pub(crate) const RECORD_RUNS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("record_runs");
/// Latest snapshot per group: group key -> postcard(meta, chunk key).
pub(crate) const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// Snapshot bytes: (chunk key, chunk index) -> up to 1 MiB.
pub(crate) const SNAPSHOT_CHUNKS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("snapshot_chunks");
/// Node-wide bookkeeping: the flush counter, the log's format.
const NODE: TableDefinition<&str, u64> = TableDefinition::new("node");

/// `NODE["log_format"]` once `LOG` rows point into the segment log (older
/// data directories held each entry in its row, and are converted once).
const LOG_FORMAT_SEGMENTS: u64 = 2;
/// `NODE["log_format"]` once `SEGMENT_LIVE` counts the live bytes (a
/// format 2 directory has them counted once, from its rows).
const LOG_FORMAT_LIVE_BYTES: u64 = 3;
/// A checkpoint at least every this many bytes of frames...
pub const CHECKPOINT_BYTES: u64 = 32 * 1024 * 1024;
/// ...or this many writer batches: what a restart replays is bounded.
pub const CHECKPOINT_BATCHES: u64 = 1024;
/// Bytes of a segment being compacted that one checkpoint scans: twice
/// what the log grows between checkpoints at most, so compaction keeps up
/// with a log whose every segment ends up mostly dead.
pub const COMPACTION_SCAN_BYTES: u64 = 2 * CHECKPOINT_BYTES;

/// What the segment log holds and has done (see [`NodeStore::log_usage`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogUsage {
    pub segments: u64,
    pub bytes: u64,
    pub syncs: u64,
    pub checkpoints: u64,
    /// Transactions the writer committed (durable or not).
    pub transactions: u64,
    /// Bytes of frames some row points at.
    pub live_bytes: u64,
    /// Bytes compaction copied since the store opened.
    pub compacted_bytes: u64,
    /// Freed segments kept to be recycled.
    pub spare_segments: u64,
    /// Segments made from spares since the store opened.
    pub recycled_segments: u64,
    /// Applies committed beside the writer, not queued behind it
    /// ([`NodeStore::write_soon`]), since the store opened.
    pub side_applies: u64,
}

/// A `LOG` row: the entry's id and where its frame is.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub(crate) struct LogRow {
    pub log_id: LogId,
    pub at: Location,
}

/// What a frame of the segment log holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum Frame<'a> {
    /// Raft log entry `log_id` of `group`; `entry` is postcard(Entry),
    /// copied as one block (serde would write a byte slice byte by byte).
    Entry {
        group: &'a str,
        log_id: LogId,
        #[serde(with = "serde_bytes")]
        entry: &'a [u8],
    },
    /// `group`'s entries from index `from` on were deleted.
    Truncate { group: &'a str, from: u64 },
    /// `group` saved its Raft vote (postcard(Vote)): durable once the
    /// segment log is synced, replayed into `RAFT_META` after a crash.
    Vote {
        group: &'a str,
        #[serde(with = "serde_bytes")]
        vote: &'a [u8],
    },
}

/// A storage failure. Fatal for the node: stop and restart from disk.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    // The source is shown in the message, so it is not also a `source()`
    // (error reports would print it twice).
    #[error("redb: {0}")]
    Redb(redb::Error),
    /// Another process (a broker still running?) holds the database.
    #[error("it is in use by another process: stop the broker running on it, or choose another --data-dir")]
    InUse,
    #[error("a stored value does not decode ({0}); the data directory is damaged or from another version")]
    Decode(#[from] postcard::Error),
    #[error("an earlier storage error stopped this store; restart the node")]
    Poisoned,
    #[error("a snapshot is malformed: {0}")]
    Snapshot(String),
    #[error("the write's transaction failed: {0}")]
    Failed(String),
    #[error("the store is closed: the node is shutting down")]
    Closed,
    #[error("the partition record store is read-only here")]
    ReadOnly,
    #[error("stored data is inconsistent ({0}); the data directory is damaged: remove this broker's replica and let it catch up from the others")]
    Inconsistent(String),
    #[error("{0}")]
    Segments(#[from] SegmentError),
}

impl From<redb::Error> for StoreError {
    fn from(error: redb::Error) -> Self {
        StoreError::Redb(error)
    }
}

macro_rules! from_redb {
    ($($error:ty),*) => {$(
        impl From<$error> for StoreError {
            fn from(error: $error) -> Self {
                StoreError::Redb(error.into())
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);

/// Called with the outcome of the commit that included a write.
type Completion = Box<dyn FnOnce(Result<(), StoreError>) + Send>;
/// Told the outcome of the transaction an append or truncation was in.
type AfterCommit = Box<dyn FnOnce(&Result<(), StoreError>) + Send>;
/// One write, run inside the writer's shared transaction.
type WriteOp = Box<dyn FnOnce(&WriteTransaction) -> Result<Completion, StoreError> + Send>;

/// Work for the node's writer.
enum Job {
    /// Run `op` in the next transaction; commit it durably if `durable`.
    Write { op: WriteOp, durable: bool },
    /// Append log entries of `group` (`(id, postcard(Entry))`): frames in
    /// the segment log, rows in `LOG`. `committed` runs once the rows are.
    Append { group: String, entries: Vec<(LogId, Vec<u8>)>, committed: Box<dyn FnOnce() + Send> },
    /// Delete `group`'s entries from index `from` on: a frame, then the
    /// rows; answered once committed.
    Truncate { group: String, from: u64, done: oneshot::Sender<Result<(), StoreError>> },
    /// Save `group`'s Raft vote (`bytes`: postcard(vote)): a frame, synced
    /// in this batch, then the `RAFT_META` row; answered once committed.
    Vote { group: String, vote: Vote, bytes: Vec<u8>, done: oneshot::Sender<Result<(), StoreError>> },
    /// Tell openraft these log entries (up to `last`, of `group`) are
    /// persisted once the segment log's next sync covers their frames.
    Persisted { callback: LogFlushed<TypeConfig>, group: String, last: LogId },
    /// Change a persisted mark once the batch's sync is through (in job
    /// order, with the reports).
    Mark(MarkChange),
    /// Keep `group`'s commit index hint (postcard(`Option<LogId>`)) for
    /// the next transaction that runs anyway (see
    /// [`NodeStore::save_committed_hint`]).
    CommittedHint { group: String, bytes: Vec<u8> },
    /// Release the database and stop.
    Close,
}

/// Most jobs gathered into one transaction.
const JOBS_PER_TRANSACTION_MAX: usize = 4096;

/// The node's database, shared by every group on the node.
///
/// All routine writes go through one writer (an OS thread in production, a
/// task in the simulation): it gathers every queued write of every group
/// into one redb transaction and, when any of them needs durability (a log
/// append waiting to be reported persisted, a vote), one fsync. That is
/// group commit across partitions, and it keeps redb's single write lock
/// and its fsyncs off tokio's worker threads.
pub struct NodeStore {
    /// `None` once closed: every later operation fails with `Closed`.
    db: Mutex<Option<Arc<Database>>>,
    segments: SegmentReader,
    /// Syncs the writer did (see [`NodeStore::flush_count`]).
    syncs: Arc<std::sync::atomic::AtomicU64>,
    /// Durable commits of the writer (checkpoints).
    checkpoints: Arc<std::sync::atomic::AtomicU64>,
    /// Transactions of the writer, durable or not.
    transactions: Arc<std::sync::atomic::AtomicU64>,
    /// Bytes compaction copied.
    compacted: Arc<std::sync::atomic::AtomicU64>,
    jobs: mpsc::UnboundedSender<Job>,
    poisoned: Arc<AtomicBool>,
    /// Applies committed beside the writer ([`NodeStore::write_soon`]).
    side_writes: Arc<SideWrites>,
    ledger: Arc<Ledger>,
    /// Bytes held in memory by every group's log tail.
    tail_bytes: NodeTailBytes,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore").finish_non_exhaustive()
    }
}

impl NodeStore {
    /// Open or create the store in `dir`: the database `keel.redb` and the
    /// segment log in `log/`.
    pub fn open(dir: &Path) -> Result<Arc<NodeStore>, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        let db = match Database::builder().create(dir.join("keel.redb")) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(StoreError::InUse),
            Err(error) => return Err(error.into()),
        };
        let segments = DirectoryDisk::new(dir.join("log")).map_err(SegmentError::from)?;
        Self::from_database(db, Arc::new(segments), super::segments::SEGMENT_BYTES, COMPACTION_SCAN_BYTES)
    }

    /// Open or create the store on any redb backend and segment disk (the
    /// simulation's crash-simulating disks, or memory), with segments of
    /// `segment_bytes`. In the simulation, call it inside the node's
    /// runtime: the writer is a task there.
    pub fn open_on(
        backend: impl redb::StorageBackend,
        segments: Arc<dyn SegmentDisk>,
        segment_bytes: u64,
    ) -> Result<Arc<NodeStore>, StoreError> {
        let db = Database::builder().set_cache_size(16 * 1024 * 1024).create_with_backend(backend)?;
        Self::from_database(db, segments, segment_bytes, COMPACTION_SCAN_BYTES)
    }

    /// [`NodeStore::open_on_disk`] with compaction scanning `scan_bytes` of
    /// a segment per checkpoint: a scan that spans checkpoints in a test.
    #[cfg(test)]
    fn open_on_disk_scanning(
        disk: &super::crash_disk::NodeDisk,
        segment_bytes: u64,
        scan_bytes: u64,
    ) -> Result<Arc<NodeStore>, StoreError> {
        let db = Database::builder().set_cache_size(16 * 1024 * 1024).create_with_backend(disk.database.clone())?;
        Self::from_database(db, Arc::new(disk.segments.clone()), segment_bytes, scan_bytes)
    }

    /// [`NodeStore::open_on`] a simulated broker disk (the simulation and
    /// crash tests), with segments of `segment_bytes`.
    pub fn open_on_disk(disk: &super::crash_disk::NodeDisk, segment_bytes: u64) -> Result<Arc<NodeStore>, StoreError> {
        Self::open_on(disk.database.clone(), Arc::new(disk.segments.clone()), segment_bytes)
    }

    /// [`NodeStore::open_on`] with the segment log in memory (tests). Each
    /// call gets a new, empty log: a test that reopens a store must use
    /// [`NodeStore::open_on_disk`] instead.
    pub fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Arc<NodeStore>, StoreError> {
        Self::open_on(backend, Arc::new(super::crash_disk::CrashDir::new()), 1024 * 1024)
    }

    fn from_database(
        db: Database,
        segments: Arc<dyn SegmentDisk>,
        segment_bytes: u64,
        scan_bytes: u64,
    ) -> Result<Arc<NodeStore>, StoreError> {
        let txn = db.begin_write()?;
        for table in [LOG, RECORDS, RECORD_RUNS, SNAPSHOT_CHUNKS] {
            txn.open_table(table)?;
        }
        txn.open_table(RAFT_META)?;
        txn.open_table(STATE)?;
        txn.open_table(super::metadata_rows::METADATA_ROWS)?;
        txn.open_table(SNAPSHOTS)?;
        txn.open_table(NODE)?;
        txn.open_table(SEGMENT_LOG)?;
        txn.open_table(SEGMENT_LIVE)?;
        txn.commit()?;
        let log = recover(&db, segments, segment_bytes)?;
        let db = Arc::new(db);
        let poisoned = Arc::new(AtomicBool::new(false));
        let side_writes = Arc::new(SideWrites::default());
        let ledger = Arc::new(Ledger::default());
        let (jobs, queue) = mpsc::unbounded_channel();
        let segments = log.reader();
        let syncs = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let checkpoints = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let transactions = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let compacted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        start_writer(Writer {
            syncs: syncs.clone(),
            checkpoints: checkpoints.clone(),
            transactions: transactions.clone(),
            compacted: compacted.clone(),
            db: Some(db.clone()),
            log,
            since_checkpoint: (0, 0),
            unused: Vec::new(),
            compacting: None,
            scan_bytes,
            scanned: std::collections::BTreeSet::new(),
            queue,
            poisoned: poisoned.clone(),
            side_writes: side_writes.clone(),
            ledger: ledger.clone(),
            committed_hints: BTreeMap::new(),
        });
        Ok(Arc::new(NodeStore {
            db: Mutex::new(Some(db)),
            segments,
            syncs,
            checkpoints,
            transactions,
            compacted,
            jobs,
            poisoned,
            side_writes,
            ledger,
            tail_bytes: NodeTailBytes::default(),
        }))
    }

    /// Reads frames of this node's segment log.
    pub(crate) fn segments(&self) -> &SegmentReader {
        &self.segments
    }

    /// The entry a `LOG` row points at.
    pub(crate) fn read_entry(&self, row: &LogRow) -> Result<openraft::Entry<TypeConfig>, StoreError> {
        read_entry(&self.segments, row)
    }

    /// The count of bytes every group's log tail holds, for their budget.
    pub(crate) fn tail_bytes(&self) -> NodeTailBytes {
        self.tail_bytes.clone()
    }

    /// What this node reported persisted, and its snapshot counts.
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Record a change of a persisted mark, in order with the writes queued
    /// before it.
    pub(crate) fn mark(&self, change: MarkChange) {
        if let Err(mpsc::error::SendError(Job::Mark(change))) = self.jobs.send(Job::Mark(change)) {
            // The writer is gone: nothing more is reported persisted, and
            // lowering a mark is always safe.
            if !matches!(change, MarkChange::Reported(..)) {
                self.ledger.apply(change);
            }
        }
    }

    /// The id of `group`'s log entry at `index`, and the last purged log
    /// id, as this database holds them (the simulation inspects a disk's
    /// durable image with it).
    pub fn log_entry_at(&self, group: &str, index: u64) -> Result<(Option<LogId>, Option<LogId>), StoreError> {
        self.read(|txn| {
            let entry = match txn.open_table(LOG)?.get((group, index))? {
                Some(value) => {
                    let row: LogRow = postcard::from_bytes(value.value())?;
                    // The frame must read back too.
                    self.read_entry(&row)?;
                    Some(row.log_id)
                }
                None => None,
            };
            let purged = match txn.open_table(RAFT_META)?.get((group, "purged"))? {
                Some(value) => Some(postcard::from_bytes(value.value())?),
                None => None,
            };
            Ok((entry, purged))
        })
    }

    /// The vote `group` saved, as its row holds it (for the simulation's
    /// check at a power cut).
    pub fn saved_vote(&self, group: &str) -> Result<Option<Vote>, StoreError> {
        self.read(|txn| match txn.open_table(RAFT_META)?.get((group, VOTE))? {
            Some(value) => Ok(Some(postcard::from_bytes(value.value())?)),
            None => Ok(None),
        })
    }

    pub(crate) fn db(&self) -> Result<Arc<Database>, StoreError> {
        if self.poisoned.load(Ordering::SeqCst) {
            return Err(StoreError::Poisoned);
        }
        self.db.lock().expect("database").clone().ok_or(StoreError::Closed)
    }

    /// Whether a storage error stopped this store (the node must restart).
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::SeqCst)
    }

    /// Close the database: later operations fail with `Closed`. Returns a
    /// handle that is dead once the writer and every in-flight operation
    /// have let go of it (after which the files can be opened again).
    pub fn close(&self) -> std::sync::Weak<Database> {
        let _ = self.jobs.send(Job::Close);
        match self.db.lock().expect("database").take() {
            Some(db) => Arc::downgrade(&db),
            None => std::sync::Weak::new(),
        }
    }

    /// Run `write` in the writer's next transaction; returns its value once
    /// that transaction committed (durably if `durable`).
    pub(crate) async fn write<T: Send + 'static>(
        &self,
        durable: bool,
        write: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.submit(durable, write).await
    }

    /// Save `group`'s commit index hint (`bytes`: postcard(`Option<LogId>`),
    /// its `RAFT_META` "committed" row) and return at once. The writer
    /// keeps the latest hint of each group and writes it in the next
    /// transaction it runs for any other reason (at the latest the
    /// checkpoint of a close): openraft advances the commit index far more
    /// often than anything else is written, and a hint costs no
    /// transaction of its own. A lower commit index than the last one is
    /// always safe (openraft derives it again: from its leader, or as a
    /// leader from its next entry), so an unwritten hint is lost like a
    /// written one that was not yet durable, and a group reopened in this
    /// process meanwhile reads the hint before it.
    pub(crate) fn save_committed_hint(&self, group: String, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.db()?;
        self.jobs.send(Job::CommittedHint { group, bytes }).map_err(|_| StoreError::Closed)
    }

    /// Queue log entries of `group` (`(id, postcard(Entry))`, in index
    /// order) for the writer's next batch without waiting for it:
    /// `committed` runs once their rows are committed (the entries are then
    /// readable through the database), and `callback` is reported
    /// persisted after the segment log's next sync. Appends queued one
    /// after another commit in that order.
    pub(crate) fn queue_append(
        &self,
        group: String,
        entries: Vec<(LogId, Vec<u8>)>,
        committed: impl FnOnce() + Send + 'static,
        callback: LogFlushed<TypeConfig>,
        last: LogId,
    ) -> Result<(), StoreError> {
        if let Err(error) = self.db() {
            callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
            return Err(error);
        }
        let job = Job::Append { group: group.clone(), entries, committed: Box::new(committed) };
        if let Err(mpsc::error::SendError(_)) = self.jobs.send(job) {
            callback.log_io_completed(Err(std::io::Error::other(StoreError::Closed.to_string())));
            return Err(StoreError::Closed);
        }
        #[cfg(madsim)]
        if keel_core::planted::is_planted(keel_core::planted::Bug::PersistedBeforeSync) {
            // The planted bug: persisted as soon as queued, before any fsync.
            self.ledger.apply(MarkChange::Reported(group, last));
            callback.log_io_completed(Ok(()));
            return Ok(());
        }
        self.persisted_later(callback, group, last);
        Ok(())
    }

    /// Save `group`'s Raft vote durably: its frame is
    /// synced in the writer's next batch (one `fdatasync` shared with the
    /// batch's appends, not a durable redb commit) and its `RAFT_META` row
    /// committed there; a restart replays the frame if that commit was
    /// lost. The sync also makes every frame queued before it durable.
    pub(crate) async fn save_vote(&self, group: String, vote: Vote) -> Result<(), StoreError> {
        self.db()?;
        let bytes = postcard::to_stdvec(&vote)?;
        let (done, answer) = oneshot::channel();
        self.jobs.send(Job::Vote { group, vote, bytes, done }).map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Poisoned))
    }

    /// Delete `group`'s log entries from index `from` on (a Raft log
    /// truncation), in order with the appends queued before.
    pub(crate) async fn truncate_log(&self, group: String, from: u64) -> Result<(), StoreError> {
        self.db()?;
        let (done, answer) = oneshot::channel();
        self.jobs.send(Job::Truncate { group, from, done }).map_err(|_| StoreError::Closed)?;
        answer.await.unwrap_or(Err(StoreError::Poisoned))
    }

    async fn submit<T: Send + 'static>(
        &self,
        durable: bool,
        write: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.db()?;
        let (reply, answer) = oneshot::channel();
        let op: WriteOp = Box::new(move |txn| {
            let value = write(txn)?;
            let complete: Completion = Box::new(move |committed| {
                let _ = reply.send(committed.map(|()| value));
            });
            Ok(complete)
        });
        self.jobs.send(Job::Write { op, durable }).map_err(|_| StoreError::Closed)?;
        // A dropped reply means the transaction failed: the store is poisoned.
        answer.await.unwrap_or(Err(StoreError::Poisoned))
    }

    /// Run `write` in a transaction that is not durable: at once on the
    /// calling thread if the writer lets it ([`SideWrites`]) and `applies`
    /// (the group and the last entry applied) has its `LOG` row committed,
    /// else in the writer's next transaction. For applies: queued, an apply
    /// waited for whatever the writer did first, mostly the fsync of the
    /// next entries (see [`SideWrites`]).
    pub(crate) async fn write_soon<T: Send + 'static>(
        &self,
        applies: Option<(&str, u64)>,
        write: impl FnOnce(&WriteTransaction) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let rows_committed = |(group, index): (&str, u64)| self.side_writes.rows_committed(group, index);
        if let (Ok(closed), true) = (self.side_writes.closed.try_lock(), applies.is_some_and(rows_committed)) {
            if !*closed && side_writes_allowed() && !self.poisoned.load(Ordering::SeqCst) {
                let written = self.write_now(false, write);
                if written.is_ok() {
                    self.transactions.fetch_add(1, Ordering::Relaxed);
                    self.side_writes.beside.fetch_add(1, Ordering::Relaxed);
                }
                return written;
            }
        }
        self.submit(false, write).await
    }

    /// Write at once on the calling thread, outside the writer. For rare,
    /// synchronous paths (snapshot chunks); it waits for redb's write lock.
    /// Never call it from inside a writer job.
    pub(crate) fn write_now<T>(
        &self,
        durable: bool,
        write: impl FnOnce(&WriteTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let result = (|| {
            let mut txn = self.db()?.begin_write()?;
            if !durable {
                txn.set_durability(Durability::None)?;
            }
            let value = write(&txn)?;
            txn.commit()?;
            Ok(value)
        })();
        // A store closed by a shutdown wrote nothing and failed nothing: a
        // snapshot still being streamed then is refused, not a disk fault.
        if let Err(error) = &result {
            if !matches!(error, StoreError::Closed) {
                tracing::error!(%error, "storage failed; this node must restart");
                self.poisoned.store(true, Ordering::SeqCst);
            }
        }
        result
    }

    /// Run `read` in a read transaction (the segments its rows name stay
    /// while it runs).
    pub(crate) fn read<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (_pin, txn) = self.begin_read()?;
        read(&txn)
    }

    /// A read transaction and the pin that keeps every segment its `LOG`
    /// rows name: hold both as long as frames are read through it.
    pub(crate) fn begin_read(&self) -> Result<(Pin, redb::ReadTransaction), StoreError> {
        let pin = self.segments.pin();
        Ok((pin, self.db()?.begin_read()?))
    }

    /// Check that the live bytes counted per segment are what the rows say
    /// (tests and the simulation's power-cut checks).
    pub fn check_live_bytes(&self) -> Result<(), StoreError> {
        self.read(|txn| {
            let counted = log_rows::count_live_bytes(&txn.open_table(LOG)?)?;
            let kept = log_rows::live_bytes(&txn.open_table(SEGMENT_LIVE)?)?;
            if counted != kept {
                return Err(StoreError::Inconsistent(format!(
                    "live bytes per segment are kept as {kept:?}, the rows say {counted:?}"
                )));
            }
            Ok(())
        })
    }

    /// Report `callback` (log entries already queued) persisted after the
    /// writer's next sync of the segment log.
    fn persisted_later(&self, callback: LogFlushed<TypeConfig>, group: String, last: LogId) {
        if let Err(mpsc::error::SendError(Job::Persisted { callback, .. })) =
            self.jobs.send(Job::Persisted { callback, group, last })
        {
            callback.log_io_completed(Err(std::io::Error::other(StoreError::Closed.to_string())));
        }
    }

    /// Delete every row of a group: its log, vote and Raft bookkeeping, its
    /// state machine, record index, records and snapshots. For a group whose topic was
    /// deleted, after its Raft has stopped. Durably (a checkpoint): a crash
    /// must not replay the group's frames into rows again, which would
    /// keep its segments live for good.
    pub async fn remove_group(&self, group: &str) -> Result<(), StoreError> {
        self.mark(MarkChange::Forgotten(group.to_string()));
        self.side_writes.rows_changed(vec![(group.to_string(), RowsChange::Forgotten)]);
        let group = group.to_string();
        self.write(true, move |txn| {
            let key = group.as_str();
            log_rows::delete_rows(txn, key, 0..u64::MAX)?;
            txn.open_table(RECORDS)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
            txn.open_table(RECORD_RUNS)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
            for name in [VOTE, "purged", COMMITTED] {
                txn.open_table(RAFT_META)?.remove((key, name))?;
            }
            txn.open_table(STATE)?.remove(key)?;
            txn.open_table(SNAPSHOTS)?.remove(key)?;
            // Snapshot chunks live under "<group>/..." ('0' follows '/').
            let (first, past) = (format!("{key}/"), format!("{key}0"));
            txn.open_table(SNAPSHOT_CHUNKS)?.retain_in((first.as_str(), 0)..(past.as_str(), 0), |_, _| false)?;
            Ok(())
        })
        .await
    }

    /// Make every earlier write durable (one fsync).
    pub async fn flush(&self) -> Result<(), StoreError> {
        self.write(true, |_| Ok(())).await
    }

    /// The segment log's segments and bytes on disk, and the syncs and
    /// checkpoints since the store opened (for metrics).
    pub fn log_usage(&self) -> LogUsage {
        let (segments, bytes) = self.segments.usage();
        let (spare_segments, recycled_segments) = self.segments.spare_usage();
        LogUsage {
            segments,
            bytes,
            syncs: self.syncs.load(Ordering::Relaxed),
            checkpoints: self.checkpoints.load(Ordering::Relaxed),
            transactions: self.transactions.load(Ordering::Relaxed),
            live_bytes: self
                .read(|txn| Ok(log_rows::live_bytes(&txn.open_table(SEGMENT_LIVE)?)?.values().sum()))
                .unwrap_or(0),
            compacted_bytes: self.compacted.load(Ordering::Relaxed),
            spare_segments,
            recycled_segments,
            side_applies: self.side_writes.beside.load(Ordering::Relaxed),
        }
    }

    /// How many times the writer synced (the segment log, or a durable
    /// commit) since the store opened (for benchmarks).
    pub fn flush_count(&self) -> Result<u64, StoreError> {
        Ok(self.syncs.load(Ordering::Relaxed))
    }
}

/// Writes that may commit beside the writer, on their callers' threads:
/// applies ([`NodeStore::write_soon`]).
///
/// An apply used to queue behind whatever the writer was doing, mostly the
/// next batch's fsync of the segment log (the entries it reports are
/// applied while the writer syncs the next ones). redb's write lock is free
/// during that sync, and an apply needs nothing the queue holds but the
/// `LOG` rows of the entries it applies (a leader may apply an entry its
/// followers stored before its own writer did): `rows_through` says up to
/// which index the writer has committed them, per group.
///
/// The writer closes the gate while it runs a transaction and for the whole
/// of a checkpoint batch, whose compaction reads rows it moves only at its
/// commit, and whose segment removal must see only durable rows. A side
/// write holds the gate open for its whole transaction, and the writer's
/// closing waits for it, so none overlaps those.
#[derive(Default)]
struct SideWrites {
    /// True while the writer has it closed.
    closed: Mutex<bool>,
    rows_through: Mutex<BTreeMap<String, u64>>,
    /// Writes committed beside the writer.
    beside: std::sync::atomic::AtomicU64,
}

/// How a batch changed a group's `LOG` rows.
enum RowsChange {
    /// Inserted up to this index (entries are appended in order, after any
    /// truncation).
    Through(u64),
    /// Deleted from this index on.
    From(u64),
    /// The group was removed.
    Forgotten,
}

impl SideWrites {
    /// Whether `group`'s `LOG` rows up to `index` are committed.
    fn rows_committed(&self, group: &str, index: u64) -> bool {
        self.rows_through.lock().expect("rows through").get(group).is_some_and(|through| *through >= index)
    }

    /// The writer committed these row changes.
    fn rows_changed(&self, changes: Vec<(String, RowsChange)>) {
        let mut through = self.rows_through.lock().expect("rows through");
        for (group, change) in changes {
            match change {
                RowsChange::Through(last) => {
                    through.insert(group, last);
                }
                RowsChange::From(first) => match first.checked_sub(1) {
                    Some(last) => {
                        through.entry(group).and_modify(|through| *through = (*through).min(last));
                    }
                    None => {
                        through.remove(&group);
                    }
                },
                RowsChange::Forgotten => {
                    through.remove(&group);
                }
            }
        }
    }

    /// The writer's: no side write from now on (waits for one under way).
    fn close(&self) {
        *self.closed.lock().expect("side writes") = true;
    }

    /// The writer's: side writes may go on.
    fn open(&self) {
        *self.closed.lock().expect("side writes") = false;
    }
}

/// The writer: owns the job queue, the segment log's appending end and a
/// handle on the database.
struct Writer {
    db: Option<Arc<Database>>,
    log: SegmentLog,
    /// Frame bytes appended and batches run since the last checkpoint.
    since_checkpoint: (u64, u64),
    /// Segments no row pointed into at a checkpoint, by the pin epoch that
    /// began after it: removed once no reader pinned before it remains.
    unused: Vec<(u64, Vec<u64>)>,
    /// The segment being compacted, and where its scan goes on.
    compacting: Option<(u64, u64)>,
    /// Bytes of it one checkpoint scans: [`COMPACTION_SCAN_BYTES`] but in
    /// tests of a scan that spans checkpoints.
    scan_bytes: u64,
    /// Segments compaction scanned to their end: not scanned again (one
    /// still live after its scan holds a frame that does not read back).
    scanned: std::collections::BTreeSet<u64>,
    syncs: Arc<std::sync::atomic::AtomicU64>,
    checkpoints: Arc<std::sync::atomic::AtomicU64>,
    transactions: Arc<std::sync::atomic::AtomicU64>,
    compacted: Arc<std::sync::atomic::AtomicU64>,
    queue: mpsc::UnboundedReceiver<Job>,
    poisoned: Arc<AtomicBool>,
    side_writes: Arc<SideWrites>,
    ledger: Arc<Ledger>,
    /// The latest commit index hint of each group not yet written
    /// ([`Job::CommittedHint`]): at most one per group on the node.
    committed_hints: BTreeMap<String, Vec<u8>>,
}

/// A live frame compaction copied: `group`'s row at `index` moves from
/// `from` to `to`.
struct Moved {
    group: String,
    index: u64,
    from: Location,
    to: LogRow,
}

/// One step of a batch's transaction, in job order.
enum Step {
    Op(WriteOp),
    /// Insert `LOG` rows of a group (their frames are appended).
    Rows(String, Vec<(u64, LogRow)>),
    /// Delete a group's `LOG` rows from an index on.
    DeleteFrom(String, u64),
    /// Set a group's vote row (its frame is appended).
    Vote(String, Vec<u8>),
}

/// A batch of the writer between its two halves ([`Writer::prepare`] and
/// [`Writer::finish`]).
struct Batch {
    steps: Vec<Step>,
    after_commit: Vec<AfterCommit>,
    persisted: Vec<LogFlushed<TypeConfig>>,
    marks: Vec<MarkChange>,
    open: bool,
    checkpoint: bool,
    /// Whether the batch syncs the log (entries to report, a vote, a
    /// checkpoint).
    syncs: bool,
    /// Whether it saves a vote (answered only once synced).
    voted: bool,
    framed: Result<(), StoreError>,
    moved: Vec<Moved>,
    /// Its transaction ran before the sync ([`Writer::commit_before_sync`]).
    committed: bool,
}

impl Writer {
    /// Gather the queued jobs after `first` into one batch.
    fn gather(&mut self, first: Job) -> Vec<Job> {
        let mut jobs = vec![first];
        while jobs.len() < JOBS_PER_TRANSACTION_MAX {
            match self.queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        jobs
    }

    /// Append a frame; counts towards the next checkpoint.
    fn append_frame(&mut self, frame: &Frame<'_>) -> Result<Location, StoreError> {
        let body = crate::encoding::to_sized_vec(frame)?;
        let at = self.log.append(&body)?;
        self.since_checkpoint.0 += body.len() as u64;
        Ok(at)
    }

    /// Run one batch. Returns false once closed.
    ///
    /// The batch's frames are appended in job order and written out, its
    /// writes (if any: reports, marks and commit hints alone run none) go
    /// in one transaction, and its callers are answered once it
    /// committed (log entries are then readable through the database;
    /// until then from memory). If entries wait to be reported persisted,
    /// the segment log is synced (one fsync covers every group) and they
    /// are reported; the transaction runs before that sync if no answer
    /// needs it ([`Writer::commit_before_sync`]), else after. The
    /// transaction is committed durably, as a checkpoint, if a write asks
    /// for it or one is due; the segment log is synced first, so a durable
    /// row never points at a lost frame.
    /// Meanwhile new jobs queue up for the next batch, so a slow fsync
    /// gathers more appends into the next one.
    #[cfg(not(madsim))]
    fn run(&mut self, jobs: Vec<Job>) -> bool {
        let batch = self.prepare(jobs);
        self.finish(batch)
    }

    /// The first half of [`Writer::run`]: the batch's frames appended and,
    /// if it syncs, written out; its transaction committed too if no answer
    /// needs the sync ([`Writer::commit_before_sync`]).
    fn prepare(&mut self, jobs: Vec<Job>) -> Batch {
        let mut steps = Vec::new();
        let mut durable = false;
        let mut after_commit: Vec<AfterCommit> = Vec::new();
        let mut persisted = Vec::new();
        // A vote's frame must be synced before the vote is answered.
        let mut voted = false;
        // Mark changes in job order: a report, then a truncation behind it,
        // leaves the mark lowered.
        let mut marks = Vec::new();
        let mut open = true;
        // Whether this batch is a checkpoint is known before any frame is
        // appended: compaction's copies go first, in checkpoints only.
        durable |= jobs.iter().any(|job| matches!(job, Job::Write { durable: true, .. } | Job::Close));
        self.since_checkpoint.1 += 1;
        let checkpoint =
            durable || self.since_checkpoint.0 >= CHECKPOINT_BYTES || self.since_checkpoint.1 >= CHECKPOINT_BATCHES;
        // Copies precede the batch's own frames, and their rows move before
        // its steps run: a replay (which sees the copies only if this
        // batch's transaction was lost) then redoes the batch on top.
        // A poisoned store writes no more frames: after an I/O error,
        // stop (a vote of another group must not reach the disk while its
        // caller is told it failed).
        let poisoned = self.poisoned.load(Ordering::SeqCst);
        // A checkpoint batch keeps side writes out from its compaction's
        // reads to its segment removal (reopened at the end of `commit`).
        if checkpoint {
            self.side_writes.close();
        }
        let (mut framed, moved) = match checkpoint && !poisoned {
            true => match self.compact_step() {
                Ok(moved) => (Ok(()), moved),
                Err(error) => (Err(error), Vec::new()),
            },
            false if poisoned => (Err(StoreError::Poisoned), Vec::new()),
            false => (Ok(()), Vec::new()),
        };
        for job in jobs {
            match job {
                Job::Write { op, durable: _ } => steps.push(Step::Op(op)),
                Job::Append { group, entries, committed } => {
                    let mut rows = Vec::with_capacity(entries.len());
                    for (log_id, entry) in &entries {
                        if framed.is_err() {
                            break;
                        }
                        match self.append_frame(&Frame::Entry { group: &group, log_id: *log_id, entry }) {
                            Ok(at) => rows.push((log_id.index, LogRow { log_id: *log_id, at })),
                            Err(error) => framed = Err(error),
                        }
                    }
                    steps.push(Step::Rows(group, rows));
                    after_commit.push(Box::new(move |outcome| {
                        if outcome.is_ok() {
                            committed();
                        }
                    }));
                }
                Job::Truncate { group, from, done } => {
                    if framed.is_ok() {
                        framed = self.append_frame(&Frame::Truncate { group: &group, from }).map(|_| ());
                    }
                    steps.push(Step::DeleteFrom(group, from));
                    after_commit.push(Box::new(move |outcome| {
                        let _ = done.send(outcome.as_ref().map(|_| ()).map_err(|e| StoreError::Failed(e.to_string())));
                    }));
                }
                Job::Vote { group, vote, bytes, done } => {
                    if framed.is_ok() {
                        framed = self.append_frame(&Frame::Vote { group: &group, vote: &bytes }).map(|_| ());
                    }
                    voted = true;
                    marks.push(MarkChange::Voted(group.clone(), vote));
                    steps.push(Step::Vote(group, bytes));
                    after_commit.push(Box::new(move |outcome| {
                        let _ = done.send(outcome.as_ref().map(|_| ()).map_err(|e| StoreError::Failed(e.to_string())));
                    }));
                }
                Job::Persisted { callback, group, last } => {
                    persisted.push(callback);
                    marks.push(MarkChange::Reported(group, last));
                }
                Job::Mark(change) => marks.push(change),
                Job::CommittedHint { group, bytes } => {
                    self.committed_hints.insert(group, bytes);
                }
                Job::Close => open = false,
            }
        }
        let syncs = checkpoint || voted || !persisted.is_empty();
        // A batch that syncs has its frames on the disk while the sync
        // runs (as a kill during the sync would find them).
        if syncs {
            framed = framed.and_then(|()| Ok(self.log.write_out()?));
        }
        let mut batch = Batch {
            steps,
            after_commit,
            persisted,
            marks,
            open,
            checkpoint,
            syncs,
            voted,
            framed,
            moved,
            committed: false,
        };
        self.commit_before_sync(&mut batch);
        batch
    }

    /// Commit the batch's transaction before its sync, and answer its
    /// callers, when none of them needs the sync: a batch that syncs only
    /// to report appended entries persisted (no vote, not a checkpoint).
    /// Its transaction is not durable, so a power cut loses it as surely
    /// as the frames not yet synced, and a durable commit (a checkpoint)
    /// still syncs the log first. Without this, a state machine's apply
    /// waited for the fsync of the entries gathered after it: a whole
    /// sync in every produce's latency.
    fn commit_before_sync(&mut self, batch: &mut Batch) {
        // A batch whose frames failed goes the usual way: `finish` stops
        // the store before anyone is answered.
        if !batch.syncs || batch.checkpoint || batch.voted || batch.framed.is_err() {
            return;
        }
        self.commit(Ok(()), batch);
        batch.committed = true;
    }

    /// The second half of [`Writer::run`]: the sync, the reports, and the
    /// transaction and the answers unless they went before the sync.
    /// Returns false once closed.
    fn finish(&mut self, mut batch: Batch) -> bool {
        let framed = std::mem::replace(&mut batch.framed, Ok(()));
        let (syncs, checkpoint) = (batch.syncs, batch.checkpoint);
        // Frames out (readable) before their rows commit; synced first if
        // anything must be durable.
        let logged = framed.and_then(|()| {
            // A transaction that failed before the sync stopped the store.
            if self.poisoned.load(Ordering::SeqCst) {
                return Err(StoreError::Poisoned);
            }
            if syncs {
                self.log.sync()?;
                self.syncs.fetch_add(1 + u64::from(checkpoint), Ordering::Relaxed);
            } else {
                self.log.write_out()?;
            }
            Ok(())
        });
        let logged = planted_ignore(logged);
        if logged.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        // After a failed batch nothing is reported persisted, not even
        // what syncs now: a failed batch's entries are lost, and a later
        // report would count a log with a hole in it. (A transaction that
        // failed before the sync poisoned the store too.)
        let logged = match self.poisoned.load(Ordering::SeqCst) {
            true => logged.and(Err(StoreError::Poisoned)),
            false => logged,
        };
        // Entries are durable once synced (a restart replays their frames):
        // they are reported now. In a batch that committed before its sync
        // their rows are in already; otherwise they commit after the
        // report, so that a follower answers its leader without waiting
        // for the transaction, and until then readers find the entries in
        // memory (`log_tail`). Reports raise marks only once true; a failed
        // batch still lowers them (in job order: a report, then a
        // truncation behind it, leaves the mark lowered).
        let reported = logged.is_ok();
        for change in std::mem::take(&mut batch.marks) {
            if reported || !matches!(change, MarkChange::Reported(..) | MarkChange::Voted(..)) {
                self.ledger.apply(change);
            }
        }
        for callback in std::mem::take(&mut batch.persisted) {
            let outcome = logged.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
            callback.log_io_completed(outcome);
        }
        if !batch.committed {
            self.commit(logged, &mut batch);
        }
        if !batch.open {
            self.db = None;
        }
        batch.open
    }

    /// Run the batch's transaction (unless `logged` failed), then answer
    /// its callers with the outcome.
    fn commit(&mut self, logged: Result<(), StoreError>, batch: &mut Batch) {
        self.side_writes.close();
        let checkpoint = batch.checkpoint;
        let (steps, moved) = (std::mem::take(&mut batch.steps), std::mem::take(&mut batch.moved));
        let position = self.log.position();
        let mut completions = Vec::new();
        // A batch with nothing else to write (reports, marks, commit
        // hints) runs no transaction; its hints wait for the next one.
        let nothing_to_write = steps.is_empty() && moved.is_empty() && !checkpoint;
        let hints = match nothing_to_write {
            true => BTreeMap::new(),
            false => std::mem::take(&mut self.committed_hints),
        };
        let rows_changed: Vec<(String, RowsChange)> = steps
            .iter()
            .filter_map(|step| match step {
                Step::Rows(group, rows) => rows.last().map(|(index, _)| (group.clone(), RowsChange::Through(*index))),
                Step::DeleteFrom(group, from) => Some((group.clone(), RowsChange::From(*from))),
                Step::Op(_) | Step::Vote(..) => None,
            })
            .collect();
        let written = logged.and_then(|()| {
            if nothing_to_write {
                return self.usable_db().map(|_| ());
            }
            self.transaction(checkpoint, |txn| {
                // Hints first: a group removed in this batch (its rows
                // deleted by a step) must not get its hint row back.
                if !hints.is_empty() {
                    let mut meta = txn.open_table(RAFT_META)?;
                    for (group, bytes) in &hints {
                        meta.insert((group.as_str(), COMMITTED), bytes.as_slice())?;
                    }
                }
                move_rows(txn, moved)?;
                for step in steps {
                    match step {
                        Step::Op(op) => completions.push(op(txn)?),
                        Step::Rows(group, rows) => log_rows::insert_rows(txn, &group, rows)?,
                        Step::DeleteFrom(group, from) => log_rows::delete_rows(txn, &group, from..u64::MAX)?,
                        Step::Vote(group, vote) => {
                            txn.open_table(RAFT_META)?.insert((group.as_str(), VOTE), vote.as_slice())?;
                        }
                    }
                }
                if checkpoint {
                    txn.open_table(SEGMENT_LOG)?.insert("checkpoint", postcard::to_stdvec(&position)?.as_slice())?;
                }
                Ok(())
            })
        });
        if checkpoint && written.is_ok() {
            self.since_checkpoint = (0, 0);
            self.checkpoints.fetch_add(1, Ordering::Relaxed);
            if let Err(error) = self.after_checkpoint() {
                tracing::error!(%error, "storage failed; this node must restart");
                self.poisoned.store(true, Ordering::SeqCst);
            }
        }
        if written.is_ok() {
            self.side_writes.rows_changed(rows_changed);
            if let Err(error) = self.remove_released() {
                tracing::error!(%error, "storage failed; this node must restart");
                self.poisoned.store(true, Ordering::SeqCst);
            }
        }
        // Open before anyone is answered: an answered apply's next one may
        // go beside the writer at once.
        self.side_writes.open();
        let outcome = |result: &Result<(), StoreError>| {
            result.as_ref().map(|_| ()).map_err(|e| StoreError::Failed(e.to_string()))
        };
        for complete in completions {
            complete(outcome(&written));
        }
        for complete in std::mem::take(&mut batch.after_commit) {
            complete(&written);
        }
    }

    /// After a checkpoint: readers from now on see its rows (a new pin
    /// epoch); the segments no row points into wait for the readers pinned
    /// before to go; and if no segment is being compacted, the oldest one
    /// at most half live is next.
    fn after_checkpoint(&mut self) -> Result<(), StoreError> {
        let Some(db) = self.db.clone() else { return Ok(()) };
        let live = log_rows::live_bytes(&db.begin_read()?.open_table(SEGMENT_LIVE)?)?;
        let epoch = self.log.next_epoch();
        let active = self.log.active();
        let waiting: std::collections::BTreeSet<u64> = self.unused.iter().flat_map(|(_, ids)| ids.clone()).collect();
        let stored: Vec<u64> = self.log.segments().into_iter().filter(|id| *id < active).collect();
        let unused: Vec<u64> =
            stored.iter().copied().filter(|id| !live.contains_key(id) && !waiting.contains(id)).collect();
        if !unused.is_empty() {
            self.unused.push((epoch, unused));
        }
        self.scanned.retain(|id| live.contains_key(id));
        // A segment whose last live frame went while its scan was under way
        // is now unused and will be removed: its scan ends here.
        if self.compacting.is_some_and(|(id, _)| !live.contains_key(&id)) {
            self.compacting = None;
        }
        if self.compacting.is_none() {
            let mostly_dead = |id: &u64| {
                let bytes = live.get(id).copied().unwrap_or(0);
                bytes > 0 && bytes.saturating_mul(2) <= self.log.segment_len(*id).unwrap_or(0)
            };
            self.compacting =
                stored.iter().copied().find(|id| !self.scanned.contains(id) && mostly_dead(id)).map(|id| (id, 0));
        }
        Ok(())
    }

    /// Remove the unused segments no pinned reader may still read.
    fn remove_released(&mut self) -> Result<(), StoreError> {
        let log = &self.log;
        let mut released = Vec::new();
        self.unused.retain(|(epoch, ids)| {
            let held = log.pinned_before(*epoch);
            if !held {
                released.extend_from_slice(ids);
            }
            held
        });
        if !released.is_empty() {
            self.log.remove(&released)?;
        }
        Ok(())
    }

    /// Copy the live frames of the next stretch (`scan_bytes`)
    /// of the segment being compacted to the end of the log, unchanged;
    /// returns the rows to point at the copies. A frame is live if its
    /// group's row at its index points at it.
    fn compact_step(&mut self) -> Result<Vec<Moved>, StoreError> {
        let (Some((segment, offset)), Some(db)) = (self.compacting, self.db.clone()) else { return Ok(Vec::new()) };
        // Every earlier batch has committed: this view is the latest.
        let txn = db.begin_read()?;
        let table = txn.open_table(LOG)?;
        let mut live: Vec<(String, LogRow)> = Vec::new();
        let mut failed = None;
        let next = self.log.scan_segment(segment, offset, self.scan_bytes, |at, body| {
            let found = (|| -> Result<(), StoreError> {
                if let Frame::Entry { group, log_id, .. } = postcard::from_bytes::<Frame<'_>>(body)? {
                    if let Some(value) = table.get((group, log_id.index))? {
                        let row: LogRow = postcard::from_bytes(value.value())?;
                        if row.at == at {
                            live.push((group.to_string(), row));
                        }
                    }
                }
                Ok(())
            })();
            if let Err(error) = found {
                failed.get_or_insert(error);
            }
            Ok(())
        })?;
        if let Some(error) = failed {
            return Err(error);
        }
        self.compacting = next.map(|offset| (segment, offset));
        if next.is_none() {
            self.scanned.insert(segment);
        }
        let mut moved = Vec::with_capacity(live.len());
        for (group, row) in live {
            let body = self.log.reader().read(row.at)?;
            let at = self.log.append(&body)?;
            self.since_checkpoint.0 += body.len() as u64;
            self.compacted.fetch_add(body.len() as u64, Ordering::Relaxed);
            moved.push(Moved { group, index: row.log_id.index, from: row.at, to: LogRow { log_id: row.log_id, at } });
        }
        Ok(moved)
    }

    /// The database, unless the store is closed or poisoned.
    fn usable_db(&self) -> Result<Arc<Database>, StoreError> {
        match &self.db {
            None => Err(StoreError::Closed),
            Some(_) if self.poisoned.load(Ordering::SeqCst) => Err(StoreError::Poisoned),
            Some(db) => Ok(db.clone()),
        }
    }

    /// One write transaction; a failure poisons the store.
    fn transaction(
        &self,
        durable: bool,
        body: impl FnOnce(&WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let db = self.usable_db()?;
        let result = (|| {
            let mut txn = db.begin_write()?;
            if durable {
                // A durable commit must change something to reach the disk.
                let mut node = txn.open_table(NODE)?;
                let count = node.get("flushes")?.map_or(0, |v| v.value());
                node.insert("flushes", count + 1)?;
            } else {
                txn.set_durability(Durability::None)?;
            }
            body(&txn)?;
            txn.commit()?;
            self.transactions.fetch_add(1, Ordering::Relaxed);
            Ok(())
        })();
        let result = planted_ignore(result);
        if let Err(error) = &result {
            tracing::error!(%error, "storage failed; this node must restart");
            self.poisoned.store(true, Ordering::SeqCst);
        }
        result
    }
}

/// The planted bug `WriteErrorsIgnored` (simulation only): a failed write
/// taken as done.
fn planted_ignore(result: Result<(), StoreError>) -> Result<(), StoreError> {
    #[cfg(madsim)]
    if let Err(error) = &result {
        if keel_core::planted::is_planted(keel_core::planted::Bug::WriteErrorsIgnored) {
            tracing::error!(%error, "planted bug: a failed write is taken as done");
            return Ok(());
        }
    }
    result
}

/// Point the rows compaction moved at their copies (each still points
/// where the copy was made from: only the writer changes rows).
fn move_rows(txn: &WriteTransaction, moved: Vec<Moved>) -> Result<(), StoreError> {
    let mut by_group: std::collections::BTreeMap<String, Vec<(u64, LogRow)>> = Default::default();
    {
        let table = txn.open_table(LOG)?;
        for Moved { group, index, from, to } in moved {
            let now: Option<LogRow> =
                table.get((group.as_str(), index))?.map(|v| postcard::from_bytes(v.value())).transpose()?;
            if now.map(|row| row.at) != Some(from) {
                return Err(StoreError::Inconsistent(format!(
                    "compaction copied {group}'s entry {index} from {from:?}, but its row now says {now:?}"
                )));
            }
            by_group.entry(group).or_default().push((index, to));
        }
    }
    for (group, rows) in by_group {
        log_rows::insert_rows(txn, &group, rows)?;
    }
    Ok(())
}

/// The entry a `LOG` row points at, decoded straight from its frame.
pub(crate) fn read_entry(segments: &SegmentReader, row: &LogRow) -> Result<openraft::Entry<TypeConfig>, StoreError> {
    let body = segments.read(row.at)?;
    match postcard::from_bytes::<Frame<'_>>(&body)? {
        Frame::Entry { log_id, entry, .. } if log_id == row.log_id => Ok(postcard::from_bytes(entry)?),
        other => Err(StoreError::Inconsistent(format!(
            "the log row of {} points at {:?}, which holds {other:?}",
            row.log_id, row.at
        ))),
    }
}

/// The first `LOG` row of each group, in group order.
fn first_rows(
    log: &impl ReadableTable<(&'static str, u64), &'static [u8]>,
) -> Result<Vec<(String, LogRow)>, StoreError> {
    let mut firsts = Vec::new();
    let mut from: Option<String> = None;
    loop {
        // Index u64::MAX is never used: the row after it is the next group's.
        let next = match &from {
            None => log.iter()?.next(),
            Some(group) => log.range((group.as_str(), u64::MAX)..)?.next(),
        };
        let Some(row) = next else { break };
        let (key, value) = row.map_err(redb::Error::from)?;
        let group = key.value().0.to_string();
        firsts.push((group.clone(), postcard::from_bytes(value.value())?));
        from = Some(group);
    }
    Ok(firsts)
}

/// Open the segment log and bring `LOG` up to date with it: rows whose
/// frames a crash took delete, frames after the checkpoint replay; then a
/// checkpoint. A data directory of an older keel (entries in their rows)
/// is converted first.
fn recover(db: &Database, disk: Arc<dyn SegmentDisk>, segment_bytes: u64) -> Result<SegmentLog, StoreError> {
    let (checkpoint, format) = {
        let txn = db.begin_read()?;
        let checkpoint: Option<Position> =
            txn.open_table(SEGMENT_LOG)?.get("checkpoint")?.map(|v| postcard::from_bytes(v.value())).transpose()?;
        (checkpoint, txn.open_table(NODE)?.get("log_format")?.map(|v| v.value()))
    };
    let mut frames: Vec<(Location, Vec<u8>)> = Vec::new();
    let mut log = SegmentLog::open_sized(disk, checkpoint, segment_bytes, |at, body| {
        frames.push((at, body.to_vec()));
        Ok(())
    })?;
    let from = checkpoint.unwrap_or(Position { segment: 0, offset: 0 });
    let txn = db.begin_write()?;
    match format {
        Some(LOG_FORMAT_LIVE_BYTES) => forget_lost_and_replay(&txn, from, &frames)?,
        Some(LOG_FORMAT_SEGMENTS) => {
            // Counted as of the checkpoint, then kept by the replay.
            log_rows::rebuild(&txn)?;
            forget_lost_and_replay(&txn, from, &frames)?;
        }
        _ => {
            // No frame is older than the conversion.
            convert_rows(&mut txn.open_table(LOG)?, &mut log)?;
            log_rows::rebuild(&txn)?;
        }
    }
    {
        let mut node = txn.open_table(NODE)?;
        node.insert("log_format", LOG_FORMAT_LIVE_BYTES)?;
        let count = node.get("flushes")?.map_or(0, |v| v.value());
        node.insert("flushes", count + 1)?;
    }
    log.sync()?;
    txn.open_table(SEGMENT_LOG)?.insert("checkpoint", postcard::to_stdvec(&log.position())?.as_slice())?;
    txn.commit()?;
    // Nobody reads yet: what no row points into goes now.
    let live = log_rows::live_bytes(&db.begin_read()?.open_table(SEGMENT_LIVE)?)?;
    let unused: Vec<u64> = log.segments().into_iter().filter(|id| !live.contains_key(id)).collect();
    log.remove(&unused)?;
    Ok(log)
}

/// Delete the `LOG` rows past the checkpoint `from` whose frames a crash
/// took, then replay the `frames` that follow it, in order.
fn forget_lost_and_replay(
    txn: &WriteTransaction,
    from: Position,
    frames: &[(Location, Vec<u8>)],
) -> Result<(), StoreError> {
    // Rows past the checkpoint whose frame did not survive: never reported
    // persisted (a report waits for the sync that would have kept them).
    // Rows past a checkpoint are only appends made after it (compaction
    // moves rows in checkpoints only), the last of their group's indexes:
    // so look from a group's end.
    let survived: std::collections::BTreeSet<Location> = frames.iter().map(|(at, _)| *at).collect();
    let mut lost = Vec::new();
    {
        let table = txn.open_table(LOG)?;
        for (group, _) in first_rows(&table)? {
            for row in table.range((group.as_str(), 0)..(group.as_str(), u64::MAX))?.rev() {
                let (key, value) = row.map_err(redb::Error::from)?;
                let row: LogRow = postcard::from_bytes(value.value())?;
                if (Position { segment: row.at.segment, offset: row.at.offset }) < from {
                    break;
                }
                if !survived.contains(&row.at) {
                    lost.push((group.clone(), key.value().1));
                }
            }
        }
    }
    for (group, index) in lost {
        log_rows::delete_rows(txn, &group, index..index + 1)?;
    }
    // Replay, in order, what happened after the checkpoint.
    for (at, body) in frames {
        match postcard::from_bytes::<Frame<'_>>(body)? {
            Frame::Entry { group, log_id, .. } => {
                log_rows::insert_rows(txn, group, [(log_id.index, LogRow { log_id, at: *at })])?
            }
            Frame::Truncate { group, from } => log_rows::delete_rows(txn, group, from..u64::MAX)?,
            Frame::Vote { group, vote } => {
                #[cfg(madsim)]
                if keel_core::planted::is_planted(keel_core::planted::Bug::VotesNotReplayed) {
                    continue;
                }
                txn.open_table(RAFT_META)?.insert((group, VOTE), vote)?;
            }
        }
    }
    Ok(())
}

/// Move the entries of an older data directory out of their rows into
/// frames (once; the caller's transaction commits both).
fn convert_rows(
    table: &mut redb::Table<'_, (&'static str, u64), &'static [u8]>,
    log: &mut SegmentLog,
) -> Result<(), StoreError> {
    let mut converted = Vec::new();
    for row in table.iter()? {
        let (key, value) = row.map_err(redb::Error::from)?;
        let (group, index) = key.value();
        let entry: openraft::Entry<TypeConfig> = postcard::from_bytes(value.value())?;
        let at =
            log.append(&postcard::to_stdvec(&Frame::Entry { group, log_id: entry.log_id, entry: value.value() })?)?;
        converted.push((group.to_string(), index, LogRow { log_id: entry.log_id, at }));
        if converted.len() % 1024 == 0 {
            // Bounded memory: out to the file as it goes.
            log.write_out()?;
        }
    }
    for (group, index, row) in converted {
        table.insert((group.as_str(), index), postcard::to_stdvec(&row)?.as_slice())?;
    }
    Ok(())
}

/// Whether applies may commit beside the writer. Always, but in a
/// simulation whose syncs take no time: there the writer never waits, and
/// the negative controls keep the traces their seed bounds were chosen on.
#[cfg(not(madsim))]
fn side_writes_allowed() -> bool {
    true
}

#[cfg(madsim)]
fn side_writes_allowed() -> bool {
    sim_sync_latency::LATENCY.with(|latency| latency.get().is_some())
}

/// Production: a dedicated OS thread, so fsync never blocks tokio.
#[cfg(not(madsim))]
fn start_writer(mut writer: Writer) {
    std::thread::Builder::new()
        .name("keel-writer".into())
        .spawn(move || {
            while let Some(first) = writer.queue.blocking_recv() {
                let jobs = writer.gather(first);
                if !writer.run(jobs) {
                    return;
                }
            }
        })
        .expect("start the writer thread");
}

/// Simulation: a task (no OS threads under madsim). A batch that syncs
/// takes the simulated time [`sim_sync_latency`] draws, its frames written
/// out, while the next batch's jobs queue up, as on a real disk.
#[cfg(madsim)]
fn start_writer(mut writer: Writer) {
    tokio::spawn(async move {
        while let Some(first) = writer.queue.recv().await {
            let jobs = writer.gather(first);
            let batch = writer.prepare(jobs);
            // A closing store (a shutdown, or the harness's look at a disk
            // image) is not kept waiting.
            if batch.syncs && batch.open {
                if let Some(latency) = sim_sync_latency::draw() {
                    tokio::time::sleep(latency).await;
                }
            }
            if !writer.finish(batch) {
                return;
            }
        }
    });
}

/// How long the storage writer's syncs take in the simulation (its disk
/// latency lane): every sync a drawn time, a share of them a stall of tens
/// or hundreds of milliseconds until the faults heal. One simulation runs
/// on one thread: the setting is the thread's, and drawn from madsim's
/// seeded generator.
#[cfg(madsim)]
pub mod sim_sync_latency {
    use std::cell::Cell;
    use std::time::Duration;

    use madsim::rand::Rng;

    /// How long syncs take.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SyncLatency {
        /// Every sync takes between these many microseconds.
        pub us: (u64, u64),
        /// One sync in this many stalls (0: none).
        pub stall_one_in: u32,
        /// How long a stall lasts, in milliseconds.
        pub stall_ms: (u64, u64),
    }

    thread_local! {
        pub(super) static LATENCY: Cell<Option<SyncLatency>> = const { Cell::new(None) };
        static STALLS: Cell<u64> = const { Cell::new(0) };
    }

    /// Syncs take `latency` from now on (`None`: no time).
    pub fn set(latency: Option<SyncLatency>) {
        LATENCY.with(|l| l.set(latency));
        STALLS.with(|s| s.set(0));
    }

    /// No more stalls (the faults heal); syncs keep their usual time.
    pub fn calm() {
        LATENCY.with(|l| l.set(l.get().map(|latency| SyncLatency { stall_one_in: 0, ..latency })));
    }

    /// The stalls drawn since [`set`].
    pub fn take_stalls() -> u64 {
        STALLS.with(|s| s.replace(0))
    }

    /// How long the next sync takes, if syncs take time.
    pub(super) fn draw() -> Option<Duration> {
        let latency = LATENCY.with(Cell::get)?;
        let mut rng = madsim::rand::thread_rng();
        if latency.stall_one_in > 0 && rng.gen_ratio(1, latency.stall_one_in) {
            STALLS.with(|s| s.set(s.get() + 1));
            return Some(Duration::from_millis(rng.gen_range(latency.stall_ms.0..=latency.stall_ms.1)));
        }
        Some(Duration::from_micros(rng.gen_range(latency.us.0..=latency.us.1)))
    }
}

#[cfg(test)]
mod tests {
    use keel_core::partition::PartitionCommand;
    use keel_core::record::Record;
    use keel_core::TimestampMs;
    use openraft::storage::{RaftLogStorage, RaftLogStorageExt};
    use openraft::{CommittedLeaderId, Entry, EntryPayload, RaftLogReader};

    use super::*;
    use crate::raft::types::{Command, Request};
    use crate::storage::crash_disk::{CrashDisk, NodeDisk};
    use crate::storage::LogStore;

    fn entry(index: u64) -> Entry<TypeConfig> {
        let records = vec![Record::from_value(format!("value-{index:0>200}").into_bytes())];
        let request =
            Request::new(TimestampMs(index), Command::Partition(PartitionCommand::Append { producer: None, records }));
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Normal(request) }
    }

    /// The store's writer held inside a batch (a write that waits), so that
    /// jobs queue up behind it.
    struct HeldWriter {
        store: Arc<NodeStore>,
        release: std::sync::mpsc::Sender<()>,
        holding: tokio::task::JoinHandle<Result<(), StoreError>>,
    }

    impl HeldWriter {
        /// Hold the writer; returns once it is inside the batch. Needs a
        /// runtime with a worker thread (the writer blocks it).
        async fn hold(store: &Arc<NodeStore>) -> HeldWriter {
            let (started, running) = std::sync::mpsc::channel();
            let (release, held) = std::sync::mpsc::channel::<()>();
            let holding = {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .write(false, move |_txn| {
                            started.send(()).unwrap();
                            held.recv().unwrap();
                            Ok(())
                        })
                        .await
                })
            };
            tokio::task::spawn_blocking(move || running.recv().unwrap()).await.unwrap();
            HeldWriter { store: store.clone(), release, holding }
        }

        /// Poison the store (as a failed batch does), then let the writer go on.
        async fn poison_and_release(self) {
            self.store.poisoned.store(true, Ordering::SeqCst);
            self.release.send(()).unwrap();
            self.holding.await.unwrap().unwrap();
        }

        /// Let the writer go on.
        async fn release(self) {
            self.release.send(()).unwrap();
            self.holding.await.unwrap().unwrap();
        }
    }

    /// Poll `future` once (queueing what it sends) and say whether it is done.
    async fn poll_once<F: std::future::Future>(mut future: std::pin::Pin<&mut F>) -> std::task::Poll<F::Output> {
        std::future::poll_fn(|cx| std::task::Poll::Ready(future.as_mut().poll(cx))).await
    }

    /// Close `store` and wait until its writer has let go of the
    /// database, so that the test may open the same files again (two
    /// databases on one backend corrupt it).
    async fn close(store: &NodeStore) {
        let database = store.close();
        while database.strong_count() > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    /// A runtime with a worker thread, for tests that hold the writer.
    fn runtime_for_a_held_writer() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    /// A store on a fresh disk whose group `g` holds entry 1.
    async fn store_with_one_entry() -> (NodeDisk, Arc<NodeStore>, LogStore) {
        let disk = NodeDisk::new();
        let store = NodeStore::open_on_disk(&disk, 1 << 20).unwrap();
        let mut log = LogStore::new(store.clone(), "g".to_string());
        log.blocking_append([entry(1)]).await.unwrap();
        (disk, store, log)
    }

    /// An apply commits beside the writer only once the `LOG` rows of the
    /// entries it applies are committed, and only while the writer's gate
    /// is open; otherwise it is queued for the writer, as before. (Without
    /// the rows check, a sweep of 400 all-fault seeds failed 6: a leader
    /// applied an entry its followers had stored before its own writer.)
    #[test]
    fn an_apply_commits_beside_the_writer_only_once_its_rows_are_committed() {
        runtime().block_on(async {
            let (_disk, store, log) = store_with_one_entry().await;
            store.flush().await.unwrap();
            let side = || store.log_usage().side_applies;
            let wrote = |value: u64| move |_: &WriteTransaction| Ok(value);
            assert_eq!(store.write_soon(Some(("g", 2)), wrote(2)).await.unwrap(), 2, "entry 2 has no row");
            assert_eq!(store.write_soon(Some(("h", 1)), wrote(3)).await.unwrap(), 3, "group h has no rows");
            assert_eq!(store.write_soon(None, wrote(4)).await.unwrap(), 4, "no entry named");
            assert_eq!(side(), 0, "an apply without its rows went beside the writer");
            assert_eq!(store.write_soon(Some(("g", 1)), wrote(5)).await.unwrap(), 5);
            assert_eq!(side(), 1, "an apply whose rows are committed was queued");
            // The writer's gate closed: queued (the writer reopens it after
            // its transaction).
            store.side_writes.close();
            assert_eq!(store.write_soon(Some(("g", 1)), wrote(6)).await.unwrap(), 6);
            assert_eq!(side(), 1, "an apply went beside the writer through its closed gate");
            assert_eq!(store.write_soon(Some(("g", 1)), wrote(7)).await.unwrap(), 7);
            assert_eq!(side(), 2);
            // A truncation takes the rows back.
            store.truncate_log("g".to_string(), 1).await.unwrap();
            assert_eq!(store.write_soon(Some(("g", 1)), wrote(8)).await.unwrap(), 8);
            assert_eq!(side(), 2, "an apply went beside the writer after its rows were truncated");
            drop(log);
        });
    }

    /// The writer closing its gate waits for a side write under way, so
    /// that none overlaps its compaction or its own transaction.
    #[test]
    fn the_writers_gate_waits_for_a_side_write_under_way() {
        let (_disk, store, _log) = runtime().block_on(async {
            let (disk, store, log) = store_with_one_entry().await;
            store.flush().await.unwrap();
            (disk, store, log)
        });
        let events = Arc::new(Mutex::new(Vec::new()));
        let (started, running) = std::sync::mpsc::channel();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let side = {
            let (store, events) = (store.clone(), events.clone());
            std::thread::spawn(move || {
                runtime().block_on(store.write_soon(Some(("g", 1)), move |_| {
                    started.send(()).unwrap();
                    held.recv().unwrap();
                    events.lock().unwrap().push("side write");
                    Ok(())
                }))
            })
        };
        running.recv().unwrap();
        let closing = {
            let (store, events) = (store.clone(), events.clone());
            std::thread::spawn(move || {
                store.side_writes.close();
                events.lock().unwrap().push("closed");
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(events.lock().unwrap().is_empty(), "the gate closed while a side write was under way");
        release.send(()).unwrap();
        side.join().unwrap().unwrap();
        closing.join().unwrap();
        assert_eq!(*events.lock().unwrap(), vec!["side write", "closed"]);
        assert_eq!(store.log_usage().side_applies, 1);
        store.side_writes.open();
    }

    /// Entries are reported persisted after the sync (their rows commit
    /// before it or after); but once a batch has failed (the store is
    /// poisoned) nothing more is reported, even what a later batch syncs:
    /// the failed batch's entries are lost, and a report past them would
    /// count a log with a hole in it.
    #[test]
    fn nothing_is_reported_persisted_once_the_store_is_poisoned() {
        runtime_for_a_held_writer().block_on(async {
            let (_disk, store, mut log) = store_with_one_entry().await;
            // Hold the writer inside a batch while an append queues up
            // behind it, then poison the store and let the writer go on.
            let held = HeldWriter::hold(&store).await;
            // Polled once, the append is queued (and waits for its report).
            let mut appended = std::pin::pin!(log.blocking_append([entry(2)]));
            assert!(
                poll_once(appended.as_mut()).await.is_pending(),
                "the append was answered while the writer was held"
            );
            held.poison_and_release().await;
            let reported = appended.await;
            assert!(reported.is_err(), "an append after a failure was reported persisted: {reported:?}");
        });
    }

    /// A batch whose frames did not reach the disk answers none of its
    /// callers with success, not even a write that needed no frame: the
    /// store stops first (after an I/O error, stop). Its transaction would
    /// commit (the database is fine), so a batch that committed before
    /// its sync whatever its frames' fate would have answered the write.
    #[test]
    fn a_batch_whose_frames_failed_answers_no_caller_with_success() {
        runtime_for_a_held_writer().block_on(async {
            let (disk, store, mut log) = store_with_one_entry().await;
            // An append and a write queue up behind the held writer, so
            // that they go in one batch.
            let held = HeldWriter::hold(&store).await;
            let mut appended = std::pin::pin!(log.blocking_append([entry(2)]));
            assert!(
                poll_once(appended.as_mut()).await.is_pending(),
                "the append was answered while the writer was held"
            );
            let mut written = std::pin::pin!(store.write(false, |_| Ok(())));
            assert!(poll_once(written.as_mut()).await.is_pending(), "the write was answered while the writer was held");
            // The segment log's device fails (the database's does not).
            disk.segments.fail();
            held.release().await;
            let written = written.await;
            assert!(written.is_err(), "a write in a batch whose frames failed was answered {written:?}");
            let appended = appended.await;
            assert!(appended.is_err(), "an entry whose frame failed was reported persisted: {appended:?}");
            assert!(store.is_poisoned(), "the store went on after an I/O error");
        });
    }

    /// A write after a shutdown closed the store (a snapshot still being
    /// streamed, say) is refused as closed; it is no disk fault, so the
    /// node is not reported failed (a graceful stop in the simulation was
    /// taken for a broker failure).
    #[test]
    fn a_write_after_close_is_refused_without_poisoning_the_store() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 1 << 20).unwrap();
            store.close();
            let refused = store.write_now(false, |_| Ok(()));
            assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");
            assert!(!store.is_poisoned(), "closing the store poisoned it");
        });
    }

    /// A vote costs a sync of the segment log, not a checkpoint, and
    /// survives power loss in every crash image: a restart replays its
    /// frame into the vote row.
    #[test]
    fn a_saved_vote_survives_power_loss_without_a_checkpoint() {
        for seed in 0..20 {
            runtime().block_on(async {
                let disk = NodeDisk::new();
                let store = NodeStore::open_on_disk(&disk, 1 << 20).unwrap();
                let mut log = LogStore::new(store.clone(), "g".to_string());
                log.blocking_append([entry(1)]).await.unwrap();
                let before = store.log_usage();
                let vote = crate::raft::types::Vote::new(3, 2);
                log.save_vote(&vote).await.unwrap();
                let after = store.log_usage();
                assert_eq!(after.checkpoints, before.checkpoints, "a vote made a checkpoint");
                assert_eq!(after.syncs, before.syncs + 1, "a vote is one sync");
                let crashed = disk.crash(seed);
                drop(log);
                drop(store);
                let store = NodeStore::open_on_disk(&crashed, 1 << 20).unwrap();
                let mut log = LogStore::new(store, "g".to_string());
                assert_eq!(log.read_vote().await.unwrap(), Some(vote), "seed {seed}");
            });
        }
    }

    /// After a failure the store writes nothing more: a vote queued behind
    /// the failed batch fails, and no crash image holds it.
    #[test]
    fn a_poisoned_store_writes_no_vote() {
        runtime_for_a_held_writer().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 1 << 20).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            // Hold the writer inside a batch while the vote queues up
            // behind it, then poison the store and let the writer go on.
            let held = HeldWriter::hold(&store).await;
            let vote = crate::raft::types::Vote::new(3, 2);
            let mut saved = std::pin::pin!(log.save_vote(&vote));
            assert!(poll_once(saved.as_mut()).await.is_pending(), "the vote was answered while the writer was held");
            held.poison_and_release().await;
            assert!(saved.await.is_err(), "a vote after a failure was saved");
            let crashed = disk.crash(0);
            drop(store);
            let mut log = LogStore::new(NodeStore::open_on_disk(&crashed, 1 << 20).unwrap(), "g".to_string());
            assert_eq!(log.read_vote().await.unwrap(), None, "a vote after a failure reached the disk");
        });
    }

    /// A removed group stays removed through a power cut: its frames are
    /// not replayed into rows again.
    #[test]
    fn a_removed_group_does_not_come_back_after_power_loss() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 1 << 20).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            log.blocking_append([entry(1), entry(2)]).await.unwrap();
            log.save_vote(&crate::raft::types::Vote::new(3, 2)).await.unwrap();
            store.remove_group("g").await.unwrap();
            let crashed = disk.crash(0);
            drop(log);
            drop(store);
            let store = NodeStore::open_on_disk(&crashed, 1 << 20).unwrap();
            assert_eq!(store.log_entry_at("g", 1).unwrap().0, None, "a removed group's entry came back");
            assert_eq!(store.saved_vote("g").unwrap(), None, "a removed group's vote came back");
            assert_eq!(store.log_usage().live_bytes, 0);
        });
    }

    #[test]
    fn purged_entries_free_their_segments_after_checkpoints() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 4096).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            for index in 1..=200 {
                log.blocking_append([entry(index)]).await.unwrap();
            }
            let filled = disk.segments.list().unwrap().len();
            assert!(filled > 5, "{filled} segments");
            log.purge(LogId::new(CommittedLeaderId::new(1, 1), 190)).await.unwrap();
            // A segment goes once two checkpoints found it unused.
            store.flush().await.unwrap();
            store.flush().await.unwrap();
            let left = disk.segments.list().unwrap().len();
            assert!(left <= 3, "{left} of {filled} segments left");
            // The first freed became spares, up to the bound.
            assert_eq!(disk.segments.spares().unwrap().len(), super::super::segments::SPARE_SEGMENTS_MAX);
            assert_eq!(store.log_usage().spare_segments, super::super::segments::SPARE_SEGMENTS_MAX as u64);
            let kept: Vec<u64> =
                log.try_get_log_entries(191..=200).await.unwrap().iter().map(|e| e.log_id.index).collect();
            assert_eq!(kept, (191..=200).collect::<Vec<_>>());
            // Later segments are spares written over.
            for index in 201..=260 {
                log.blocking_append([entry(index)]).await.unwrap();
            }
            assert!(store.log_usage().recycled_segments >= 2, "{:?}", store.log_usage());
            close(&store).await;

            // And after a power cut: every entry kept or appended since,
            // none of the spares' earlier entries.
            let after = disk.crash(7);
            let store = NodeStore::open_on_disk(&after, 4096).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            let entries = log.try_get_log_entries(191..=260).await.unwrap();
            assert_eq!(entries, (191..=260).map(entry).collect::<Vec<_>>());
            assert_eq!(log.get_log_state().await.unwrap().last_log_id, Some(log_id(260)));
            close(&store).await;
        });
    }

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    /// A commit hint runs no transaction of its own: a batch of nothing
    /// but a hint (and a mark, to see the batch through) commits none, and
    /// the hint is written with the next transaction (here an append's); a
    /// close's checkpoint writes the latest.
    #[test]
    fn a_commit_hint_is_written_with_the_next_transaction() {
        runtime_for_a_held_writer().block_on(async {
            let (disk, store, mut log) = store_with_one_entry().await;
            // Queued behind a held batch, the hint and the mark make the
            // next batch alone.
            let held = HeldWriter::hold(&store).await;
            log.save_committed(Some(log_id(1))).await.unwrap();
            store.mark(MarkChange::Reported("probe".to_string(), log_id(1)));
            held.release().await;
            let before = store.log_usage().transactions;
            while !store.ledger().persisted_marks().contains_key("probe") {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            assert_eq!(store.log_usage().transactions, before, "a batch of a hint ran a transaction");
            assert_eq!(log.read_committed().await.unwrap(), None, "the hint was written before any other write");
            log.blocking_append([entry(2)]).await.unwrap();
            assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1)));
            log.save_committed(Some(log_id(2))).await.unwrap();
            close(&store).await;
            let store = NodeStore::open_on_disk(&disk.crash(3), 1 << 20).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            assert_eq!(log.read_committed().await.unwrap(), Some(log_id(2)));
            close(&store).await;
        });
    }

    /// A hint still waiting when its group is removed is not written
    /// after the removal: the group's rows stay gone.
    #[test]
    fn a_waiting_commit_hint_does_not_outlive_its_group() {
        runtime().block_on(async {
            let (disk, store, mut log) = store_with_one_entry().await;
            log.save_committed(Some(log_id(1))).await.unwrap();
            store.remove_group("g").await.unwrap();
            close(&store).await;
            let store = NodeStore::open_on_disk(&disk.crash(3), 1 << 20).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            assert_eq!(log.read_committed().await.unwrap(), None);
            close(&store).await;
        });
    }

    /// A quiet group that appends now and then and never purges leaves a
    /// few live frames in every segment; compaction copies them on, so the
    /// busy group's purged frames do not stay on disk because of them.
    #[test]
    fn a_quiet_group_does_not_keep_a_busy_groups_dead_segments() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 4096).unwrap();
            let mut busy = LogStore::new(store.clone(), "busy".to_string());
            let mut quiet = LogStore::new(store.clone(), "quiet".to_string());
            let mut most = 0;
            for index in 1..=600u64 {
                busy.blocking_append([entry(index)]).await.unwrap();
                if index % 20 == 0 {
                    quiet.blocking_append([entry(index / 20)]).await.unwrap();
                    busy.purge(log_id(index - 10)).await.unwrap();
                    store.flush().await.unwrap();
                    most = most.max(disk.segments.list().unwrap().len());
                }
            }
            store.flush().await.unwrap();
            store.flush().await.unwrap();
            store.check_live_bytes().unwrap();
            // 30 quiet entries and 10 busy ones of about 300 bytes: three
            // segments of 4 KiB hold them; without compaction there are 40.
            let left = disk.segments.list().unwrap().len();
            assert!(left <= 6, "{left} segments left (at most {most} on the way)");
            assert!(most <= 10, "{most} segments at most on the way");
            let kept = quiet.try_get_log_entries(1..=30).await.unwrap();
            assert_eq!(kept, (1..=30).map(entry).collect::<Vec<_>>());
            close(&store).await;

            // The moved rows and their counts survive a power cut.
            let after = disk.crash(3);
            let store = NodeStore::open_on_disk(&after, 4096).unwrap();
            store.check_live_bytes().unwrap();
            let mut quiet = LogStore::new(store.clone(), "quiet".to_string());
            assert_eq!(quiet.try_get_log_entries(1..=30).await.unwrap(), (1..=30).map(entry).collect::<Vec<_>>());
            let mut busy = LogStore::new(store.clone(), "busy".to_string());
            assert_eq!(busy.try_get_log_entries(591..=600).await.unwrap(), (591..=600).map(entry).collect::<Vec<_>>());
            close(&store).await;
        });
    }

    /// The segment being compacted loses its last live frame halfway
    /// through its scan (in the checkpoint that scanned its first half):
    /// it is removed, and its scan ends instead of going on in a segment
    /// that is gone (which would fail the store).
    #[test]
    fn a_scan_ends_when_its_segment_empties_halfway() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            // Half a segment per checkpoint.
            let store = NodeStore::open_on_disk_scanning(&disk, 4096, 2048).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            for index in 1..=40 {
                log.blocking_append([entry(index)]).await.unwrap();
            }
            let first = *disk.segments.list().unwrap().iter().min().unwrap();
            // The first segment is at most half live: the next checkpoint
            // picks it for compaction.
            log.purge(log_id(10)).await.unwrap();
            store.flush().await.unwrap();
            // One durable batch: its compaction step scans the first half
            // of that segment, and it purges the segment's last live frames.
            let purged = postcard::to_stdvec(&log_id(20)).unwrap();
            store
                .write(true, move |txn| {
                    txn.open_table(RAFT_META)?.insert(("g", "purged"), purged.as_slice())?;
                    crate::storage::records::delete_unused_log(txn, &txn.open_table(RECORD_RUNS)?, "g")
                })
                .await
                .unwrap();
            assert!(!disk.segments.list().unwrap().contains(&first), "the emptied segment is removed");
            // The next checkpoints go on without it.
            store.flush().await.unwrap();
            store.flush().await.unwrap();
            store.check_live_bytes().unwrap();
            assert_eq!(log.try_get_log_entries(21..=40).await.unwrap(), (21..=40).map(entry).collect::<Vec<_>>());
            close(&store).await;
        });
    }

    /// A reader holding an older view keeps the segments its rows name,
    /// however many checkpoints pass; they go once it lets go.
    #[test]
    fn a_pinned_reader_keeps_the_segments_its_view_names() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 4096).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            for index in 1..=100 {
                log.blocking_append([entry(index)]).await.unwrap();
            }
            let (pin, view) = store.begin_read().unwrap();
            log.purge(log_id(95)).await.unwrap();
            for _ in 0..4 {
                store.flush().await.unwrap();
            }
            let row: LogRow =
                postcard::from_bytes(view.open_table(LOG).unwrap().get(("g", 1)).unwrap().unwrap().value()).unwrap();
            assert_eq!(store.read_entry(&row).unwrap(), entry(1), "the old view reads its first entry");
            let held = disk.segments.list().unwrap().len();
            drop((view, pin));
            store.flush().await.unwrap();
            let left = disk.segments.list().unwrap().len();
            assert!(left < held && left <= 3, "{left} segments left, {held} while pinned");
            close(&store).await;
        });
    }

    /// A data directory of the first segment-log format has no live byte
    /// counts: they are counted from its rows when it opens.
    #[test]
    fn live_bytes_are_counted_for_a_directory_without_them() {
        runtime().block_on(async {
            let disk = NodeDisk::new();
            let store = NodeStore::open_on_disk(&disk, 4096).unwrap();
            let mut log = LogStore::new(store.clone(), "g".to_string());
            for index in 1..=50 {
                log.blocking_append([entry(index)]).await.unwrap();
            }
            store.flush().await.unwrap();
            close(&store).await;
            {
                let db = Database::builder().create_with_backend(disk.database.clone()).unwrap();
                let txn = db.begin_write().unwrap();
                txn.open_table(SEGMENT_LIVE).unwrap().retain(|_, _| false).unwrap();
                txn.open_table(NODE).unwrap().insert("log_format", LOG_FORMAT_SEGMENTS).unwrap();
                txn.commit().unwrap();
            }
            let store = NodeStore::open_on_disk(&disk, 4096).unwrap();
            store.check_live_bytes().unwrap();
            let live = store.read(|txn| log_rows::live_bytes(&txn.open_table(SEGMENT_LIVE)?)).unwrap();
            assert!(!live.is_empty());
            let mut log = LogStore::new(store.clone(), "g".to_string());
            assert_eq!(log.try_get_log_entries(1..=50).await.unwrap(), (1..=50).map(entry).collect::<Vec<_>>());
            close(&store).await;
        });
    }

    /// A data directory of an older keel kept each entry in its `LOG`
    /// row: the first open moves them into frames, once.
    #[test]
    fn an_older_data_directory_is_converted_once() {
        let disk = CrashDisk::new();
        {
            let db = Database::builder().create_with_backend(disk.clone()).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut table = txn.open_table(LOG).unwrap();
                for index in 1..=5 {
                    table.insert(("old", index), postcard::to_stdvec(&entry(index)).unwrap().as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let segments = crate::storage::crash_disk::CrashDir::new();
        runtime().block_on(async {
            let mut image = disk.crash(0);
            for _ in 0..2 {
                let store = NodeStore::open_on(image.clone(), Arc::new(segments.clone()), 4096).unwrap();
                let mut log = LogStore::new(store.clone(), "old".to_string());
                let entries = log.try_get_log_entries(1..=5).await.unwrap();
                assert_eq!(entries, (1..=5).map(entry).collect::<Vec<_>>());
                let state = log.get_log_state().await.unwrap();
                assert_eq!(state.last_log_id.map(|l| l.index), Some(5));
                close(&store).await;
                // The next open sees the converted image (made durable as
                // it opened): its rows now point at frames.
                image = image.crash(0);
            }
        });
    }
}
