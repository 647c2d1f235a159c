//! The node's redb database and its group-commit flusher.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use openraft::storage::LogFlushed;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};
use tokio::sync::{mpsc, oneshot};

use super::ledger::{Ledger, MarkChange};
use crate::raft::types::{LogId, TypeConfig};

/// Raft log entries: (group key, log index) -> postcard(Entry).
pub(crate) const LOG: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: (group key, "vote" | "purged" | "committed") -> postcard.
pub(crate) const RAFT_META: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("raft_meta");
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
/// Node-wide bookkeeping: the flush counter.
const NODE: TableDefinition<&str, u64> = TableDefinition::new("node");

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
/// One write, run inside the writer's shared transaction.
type WriteOp = Box<dyn FnOnce(&WriteTransaction) -> Result<Completion, StoreError> + Send>;

/// Work for the node's writer.
enum Job {
    /// Run `op` in the next transaction; commit it durably if `durable`.
    Write { op: WriteOp, durable: bool },
    /// Tell openraft these log entries (up to `last`, of `group`) are
    /// persisted after the next durable commit.
    Persisted { callback: LogFlushed<TypeConfig>, group: String, last: LogId },
    /// Change a persisted mark once the batch is through (in job order).
    Mark(MarkChange),
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
    jobs: mpsc::UnboundedSender<Job>,
    poisoned: Arc<AtomicBool>,
    ledger: Arc<Ledger>,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore").finish_non_exhaustive()
    }
}

impl NodeStore {
    /// Open or create the database in `dir/keel.redb`.
    pub fn open(dir: &Path) -> Result<Arc<NodeStore>, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        let db = match Database::builder().create(dir.join("keel.redb")) {
            Ok(db) => db,
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => return Err(StoreError::InUse),
            Err(error) => return Err(error.into()),
        };
        Self::from_database(db)
    }

    /// Open or create the database on any redb backend (the simulation's
    /// crash-simulating disk, or memory). In the simulation, call it inside
    /// the node's runtime: the writer is a task there.
    pub fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Arc<NodeStore>, StoreError> {
        let db = Database::builder().set_cache_size(16 * 1024 * 1024).create_with_backend(backend)?;
        Self::from_database(db)
    }

    fn from_database(db: Database) -> Result<Arc<NodeStore>, StoreError> {
        let txn = db.begin_write()?;
        for table in [LOG, RECORDS, RECORD_RUNS, SNAPSHOT_CHUNKS] {
            txn.open_table(table)?;
        }
        txn.open_table(RAFT_META)?;
        txn.open_table(STATE)?;
        txn.open_table(SNAPSHOTS)?;
        txn.open_table(NODE)?;
        txn.commit()?;
        let db = Arc::new(db);
        let poisoned = Arc::new(AtomicBool::new(false));
        let ledger = Arc::new(Ledger::default());
        let (jobs, queue) = mpsc::unbounded_channel();
        start_writer(Writer { db: Some(db.clone()), queue, poisoned: poisoned.clone(), ledger: ledger.clone() });
        Ok(Arc::new(NodeStore { db: Mutex::new(Some(db)), jobs, poisoned, ledger }))
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
                    let entry: openraft::Entry<TypeConfig> = postcard::from_bytes(value.value())?;
                    Some(entry.log_id)
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

    /// Queue `write` for the writer's next (not durable) transaction and
    /// return at once; a failure poisons the store, which later operations
    /// then report. For writes nothing waits on.
    pub(crate) fn queue(
        &self,
        write: impl FnOnce(&WriteTransaction) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        self.db()?;
        let op: WriteOp = Box::new(move |txn| {
            write(txn)?;
            let complete: Completion = Box::new(|_| {});
            Ok(complete)
        });
        self.jobs.send(Job::Write { op, durable: false }).map_err(|_| StoreError::Closed)
    }

    /// Queue `write` (log entries) for the writer's next transaction without
    /// waiting for it: `committed` runs once that transaction committed
    /// (the entries are then readable from the database), and `callback`
    /// is reported persisted after the durable commit that follows. Writes
    /// queued one after another commit in that order.
    pub(crate) fn queue_reporting_persisted(
        &self,
        write: impl FnOnce(&WriteTransaction) -> Result<(), StoreError> + Send + 'static,
        committed: impl FnOnce() + Send + 'static,
        callback: LogFlushed<TypeConfig>,
        group: String,
        last: LogId,
    ) -> Result<(), StoreError> {
        if let Err(error) = self.db() {
            callback.log_io_completed(Err(std::io::Error::other(error.to_string())));
            return Err(error);
        }
        let op: WriteOp = Box::new(move |txn| {
            write(txn)?;
            let complete: Completion = Box::new(move |outcome| {
                if outcome.is_ok() {
                    committed();
                }
            });
            Ok(complete)
        });
        if let Err(mpsc::error::SendError(_)) = self.jobs.send(Job::Write { op, durable: false }) {
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
        if result.is_err() {
            self.poisoned.store(true, Ordering::SeqCst);
        }
        result
    }

    /// Run `read` in a read transaction.
    pub(crate) fn read<T>(
        &self,
        read: impl FnOnce(&redb::ReadTransaction) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let txn = self.db()?.begin_read()?;
        read(&txn)
    }

    /// Report `callback` (log entries already queued) persisted after the
    /// writer's next durable commit.
    fn persisted_later(&self, callback: LogFlushed<TypeConfig>, group: String, last: LogId) {
        if let Err(mpsc::error::SendError(Job::Persisted { callback, .. })) =
            self.jobs.send(Job::Persisted { callback, group, last })
        {
            callback.log_io_completed(Err(std::io::Error::other(StoreError::Closed.to_string())));
        }
    }

    /// Delete every row of a group: its log, vote and Raft bookkeeping, its
    /// state machine, record index, records and snapshots. For a group whose topic was
    /// deleted, after its Raft has stopped.
    pub async fn remove_group(&self, group: &str) -> Result<(), StoreError> {
        self.mark(MarkChange::Forgotten(group.to_string()));
        let group = group.to_string();
        self.write(false, move |txn| {
            let key = group.as_str();
            txn.open_table(LOG)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
            txn.open_table(RECORDS)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
            txn.open_table(RECORD_RUNS)?.retain_in((key, 0)..=(key, u64::MAX), |_, _| false)?;
            for name in ["vote", "purged", "committed"] {
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

    /// How many durable commits this database has done (for benchmarks).
    pub fn flush_count(&self) -> Result<u64, StoreError> {
        self.read(|txn| Ok(txn.open_table(NODE)?.get("flushes")?.map_or(0, |v| v.value())))
    }
}

/// The writer: owns the job queue and a handle on the database.
struct Writer {
    db: Option<Arc<Database>>,
    queue: mpsc::UnboundedReceiver<Job>,
    poisoned: Arc<AtomicBool>,
    ledger: Arc<Ledger>,
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

    /// Run one batch. Returns false once closed.
    ///
    /// The writes go in one transaction, synced only if one of them asks
    /// for it; their callers are answered at once (log entries are then
    /// readable). If log entries wait to be reported persisted, one more
    /// durable commit follows: a durable commit makes every earlier commit
    /// durable too. Meanwhile new jobs queue up for the next batch, so a
    /// slow fsync gathers more appends into the next one.
    fn run(&mut self, jobs: Vec<Job>) -> bool {
        let mut writes = Vec::new();
        let mut persisted = Vec::new();
        // Mark changes in job order: a report, then a truncation behind it,
        // leaves the mark lowered.
        let mut marks = Vec::new();
        let mut open = true;
        for job in jobs {
            match job {
                Job::Write { op, durable } => writes.push((op, durable)),
                Job::Persisted { callback, group, last } => {
                    persisted.push(callback);
                    marks.push(MarkChange::Reported(group, last));
                }
                Job::Mark(change) => marks.push(change),
                Job::Close => open = false,
            }
        }
        let durable = writes.iter().any(|(_, durable)| *durable);
        let mut completions = Vec::new();
        let written = self.transaction(durable, |txn| {
            for (op, _) in writes {
                completions.push(op(txn)?);
            }
            Ok(())
        });
        let outcome = |result: &Result<(), StoreError>| {
            result.as_ref().map(|_| ()).map_err(|e| StoreError::Failed(e.to_string()))
        };
        for complete in completions {
            complete(outcome(&written));
        }
        let synced = if persisted.is_empty() {
            None
        } else if durable || written.is_err() {
            Some(written)
        } else {
            Some(self.transaction(true, |_| Ok(())))
        };
        // Reports raise marks only once they are true; a failed batch
        // still lowers them.
        let reported = synced.as_ref().is_some_and(|s| s.is_ok());
        for change in marks {
            if reported || !matches!(change, MarkChange::Reported(..)) {
                self.ledger.apply(change);
            }
        }
        if let Some(synced) = synced {
            for callback in persisted {
                callback.log_io_completed(outcome(&synced).map_err(|e| std::io::Error::other(e.to_string())));
            }
        }
        if !open {
            self.db = None;
        }
        open
    }

    /// One write transaction; a failure poisons the store.
    fn transaction(
        &self,
        durable: bool,
        body: impl FnOnce(&WriteTransaction) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let Some(db) = self.db.clone().filter(|_| !self.poisoned.load(Ordering::SeqCst)) else {
            return Err(if self.db.is_none() { StoreError::Closed } else { StoreError::Poisoned });
        };
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
            Ok(())
        })();
        if let Err(error) = &result {
            tracing::error!(%error, "storage failed; this node must restart");
            self.poisoned.store(true, Ordering::SeqCst);
        }
        result
    }
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

/// Simulation: a task (no OS threads under madsim).
#[cfg(madsim)]
fn start_writer(mut writer: Writer) {
    tokio::spawn(async move {
        while let Some(first) = writer.queue.recv().await {
            let jobs = writer.gather(first);
            if !writer.run(jobs) {
                return;
            }
        }
    });
}
