//! The node's redb database and its group-commit flusher.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use openraft::storage::LogFlushed;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::Notify;

use crate::raft::types::TypeConfig;

/// Raft log entries: (group key, log index) -> postcard(Entry).
pub(crate) const LOG: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("raft_log");
/// Raft metadata: (group key, "vote" | "purged" | "committed") -> postcard.
pub(crate) const RAFT_META: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("raft_meta");
/// State machines: group key -> postcard(Applied).
pub(crate) const STATE: TableDefinition<&str, &[u8]> = TableDefinition::new("state_machine");
/// Partition records: (group key, offset) -> postcard(StoredRecord).
pub(crate) const RECORDS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("records");
/// Latest snapshot per group: group key -> postcard(meta, chunk key).
pub(crate) const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
/// Snapshot bytes: (chunk key, chunk index) -> up to 1 MiB.
pub(crate) const SNAPSHOT_CHUNKS: TableDefinition<(&str, u64), &[u8]> = TableDefinition::new("snapshot_chunks");
/// Node-wide bookkeeping: the flush counter.
const NODE: TableDefinition<&str, u64> = TableDefinition::new("node");

/// A storage failure. Fatal for the node: stop and restart from disk.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redb: {0}")]
    Redb(#[from] redb::Error),
    #[error("a stored value does not decode ({0}); the data directory is damaged or from another version")]
    Decode(#[from] postcard::Error),
    #[error("an earlier storage error stopped this store; restart the node")]
    Poisoned,
    #[error("a snapshot is malformed: {0}")]
    Snapshot(String),
    #[error("the store is closed: the node is shutting down")]
    Closed,
    #[error("the partition record store is read-only here")]
    ReadOnly,
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

/// The node's database, shared by every group on the node.
pub struct NodeStore {
    /// `None` once closed: every later operation fails with `Closed`.
    db: Mutex<Option<Arc<Database>>>,
    pending_flush: Mutex<VecDeque<LogFlushed<TypeConfig>>>,
    flush_wanted: Notify,
    poisoned: Mutex<bool>,
}

impl std::fmt::Debug for NodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStore").field("db", &self.db).finish_non_exhaustive()
    }
}

impl NodeStore {
    /// Open or create the database in `dir/keel.redb`.
    pub fn open(dir: &Path) -> Result<Arc<NodeStore>, StoreError> {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Redb(redb::Error::Io(e)))?;
        let db = Database::builder().create(dir.join("keel.redb"))?;
        Self::from_database(db)
    }

    /// Open or create the database on any redb backend (the simulation's
    /// crash-simulating disk, or memory).
    pub fn open_with_backend(backend: impl redb::StorageBackend) -> Result<Arc<NodeStore>, StoreError> {
        let db = Database::builder().set_cache_size(16 * 1024 * 1024).create_with_backend(backend)?;
        Self::from_database(db)
    }

    fn from_database(db: Database) -> Result<Arc<NodeStore>, StoreError> {
        let txn = db.begin_write()?;
        for table in [LOG, RECORDS, SNAPSHOT_CHUNKS] {
            txn.open_table(table)?;
        }
        txn.open_table(RAFT_META)?;
        txn.open_table(STATE)?;
        txn.open_table(SNAPSHOTS)?;
        txn.open_table(NODE)?;
        txn.commit()?;
        Ok(Arc::new(NodeStore {
            db: Mutex::new(Some(Arc::new(db))),
            pending_flush: Mutex::new(VecDeque::new()),
            flush_wanted: Notify::new(),
            poisoned: Mutex::new(false),
        }))
    }

    pub(crate) fn db(&self) -> Result<Arc<Database>, StoreError> {
        if *self.poisoned.lock().expect("poison flag") {
            return Err(StoreError::Poisoned);
        }
        self.db.lock().expect("database").clone().ok_or(StoreError::Closed)
    }

    /// Close the database: later operations fail with `Closed`. Returns a
    /// handle that is dead once the last in-flight operation has finished
    /// (after which the files can be opened again).
    pub fn close(&self) -> std::sync::Weak<Database> {
        match self.db.lock().expect("database").take() {
            Some(db) => Arc::downgrade(&db),
            None => std::sync::Weak::new(),
        }
    }

    /// Run `write` in one write transaction and commit it, durably or not.
    /// Never hold the transaction across an `.await`: redb allows one writer.
    pub(crate) fn write<T>(
        &self,
        durable: bool,
        write: impl FnOnce(&redb::WriteTransaction) -> Result<T, StoreError>,
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
            *self.poisoned.lock().expect("poison flag") = true;
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

    /// Queue a log flush callback: it completes after the next durable
    /// commit (see [`NodeStore::run_flusher`]).
    pub(crate) fn flush_later(&self, callback: LogFlushed<TypeConfig>) {
        self.pending_flush.lock().expect("flush queue").push_back(callback);
        self.flush_wanted.notify_one();
    }

    /// Make every earlier commit durable with one fsync: a durable commit
    /// of a counter (an empty transaction might not reach the disk).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.write(true, |txn| {
            let mut node = txn.open_table(NODE)?;
            let count = node.get("flushes")?.map_or(0, |v| v.value());
            node.insert("flushes", count + 1)?;
            Ok(())
        })
    }

    /// The group-commit loop: wait for queued callbacks, make all of them
    /// durable with one flush, then tell openraft. Runs until the node
    /// stops; one per node.
    pub async fn run_flusher(self: Arc<Self>) {
        loop {
            self.flush_wanted.notified().await;
            let batch: Vec<_> = self.pending_flush.lock().expect("flush queue").drain(..).collect();
            if batch.is_empty() {
                continue;
            }
            let result = self.flush_off_runtime().await;
            for callback in batch {
                let outcome = result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string()));
                callback.log_io_completed(outcome);
            }
        }
    }

    /// fsync blocks the thread: in production run it on a blocking thread,
    /// in the simulation (no OS threads) inline.
    async fn flush_off_runtime(self: &Arc<Self>) -> Result<(), StoreError> {
        #[cfg(not(madsim))]
        {
            let store = Arc::clone(self);
            match tokio::task::spawn_blocking(move || store.flush()).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Poisoned),
            }
        }
        #[cfg(madsim)]
        {
            self.flush()
        }
    }

    /// How many durable flushes this database has done (for benchmarks).
    pub fn flush_count(&self) -> Result<u64, StoreError> {
        self.read(|txn| Ok(txn.open_table(NODE)?.get("flushes")?.map_or(0, |v| v.value())))
    }
}
