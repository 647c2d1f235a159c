//! openraft's `RaftStateMachine` for one group: keel-core's metadata or
//! partition state machine, persisted in the node's database.
//!
//! Apply decodes nothing itself and decides nothing: every outcome comes
//! from keel-core (G7). A command meant for the other kind of group is
//! recorded as `Response::WrongGroup`.

use std::sync::{Arc, Mutex};

use keel_core::metadata::MetadataState;
use keel_core::partition::{PartitionState, RecordLog};
use keel_core::record::StoredRecord;
use keel_core::{Limits, Offset};
use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{Entry, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder};
use redb::ReadableTable;
use serde::{Deserialize, Serialize};

use super::log_store::io_error;
use super::metadata_rows::{self, METADATA_ROWS};
use super::records::{self, RecordReader, RecordWriter};
use super::snapshot_file::{self, SnapshotFile};
use super::store::{NodeStore, StoreError, SNAPSHOTS, STATE};
use crate::raft::types::{Command, LogId, Response, SnapshotMeta, StorageError, StoredMembership, TypeConfig};

/// The core state machine a group runs, shared behind an `Arc`: readers take
/// it without copying, and apply copies it (once per applied batch) only
/// while a reader still holds the previous one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupState {
    Metadata(Arc<MetadataState>),
    Partition(Arc<PartitionState>),
}

/// What a group's state machine has applied: a snapshot's head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Applied {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: GroupState,
}

/// What a group's row in `STATE` holds: `Applied`, less the metadata's
/// state, which is kept as rows of its own (`metadata_rows`) so that an
/// apply writes only what it changed.
#[derive(Serialize, Deserialize)]
struct AppliedRow {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    state: StoredState,
}

/// Variants in `GroupState`'s order.
#[derive(Serialize, Deserialize)]
enum StoredState {
    /// In `METADATA_ROWS`.
    MetadataRows,
    Partition(Arc<PartitionState>),
}

/// Write `group`'s applied state in `txn`: a partition's whole, the
/// metadata's changed rows (`every_row`: all of them, replacing any).
fn write_applied(
    txn: &redb::WriteTransaction,
    group: &str,
    last_applied: Option<LogId>,
    membership: &StoredMembership,
    state: &mut GroupState,
    every_row: bool,
) -> Result<(), StoreError> {
    let stored = match state {
        GroupState::Metadata(metadata) => {
            let metadata = Arc::make_mut(metadata);
            match every_row {
                true => metadata_rows::write_all(txn, metadata)?,
                false => metadata_rows::write_changes(txn, metadata)?,
            }
            StoredState::MetadataRows
        }
        GroupState::Partition(partition) => StoredState::Partition(Arc::clone(partition)),
    };
    let row = AppliedRow { last_applied, membership: membership.clone(), state: stored };
    txn.open_table(STATE)?.insert(group, postcard::to_stdvec(&row)?.as_slice())?;
    Ok(())
}

/// `group`'s applied state as stored, if any.
fn read_applied(txn: &redb::ReadTransaction, group: &str) -> Result<Option<Applied>, StoreError> {
    let Some(value) = txn.open_table(STATE)?.get(group)? else { return Ok(None) };
    let row: AppliedRow = postcard::from_bytes(value.value())?;
    let state = match row.state {
        StoredState::Partition(partition) => GroupState::Partition(partition),
        StoredState::MetadataRows => {
            let metadata = metadata_rows::read(&txn.open_table(METADATA_ROWS)?)?.ok_or_else(|| {
                StoreError::Inconsistent(format!(
                    "group {group}'s state names metadata rows, but none are stored: this data directory \
                     was written by an older keel; move it aside and start the broker on an empty one"
                ))
            })?;
            GroupState::Metadata(Arc::new(metadata))
        }
    };
    Ok(Some(Applied { last_applied: row.last_applied, membership: row.membership, state }))
}

/// A group's state, shared with the node (for reads and reconciliation).
/// Locked only for short synchronous sections, never across an `.await`.
pub type SharedGroupState = Arc<Mutex<GroupState>>;

/// One group's state machine.
#[derive(Debug, Clone)]
pub struct GroupStateMachine {
    store: Arc<NodeStore>,
    group: String,
    last_applied: Arc<Mutex<(Option<LogId>, StoredMembership)>>,
    /// The state apply works on, inside the writer's transaction.
    working: SharedGroupState,
    /// The state as of the last committed apply: what readers see, so that
    /// it never runs ahead of the committed records.
    state: SharedGroupState,
    /// Woken after every applied batch (one waiter: the node's reconciler).
    applied_notify: Option<Arc<tokio::sync::Notify>>,
    /// Every waiter woken after each applied batch or installed snapshot:
    /// long polls waiting for records or for a claim to change. A
    /// `Notify` wakes its waiters in the order they came (no RNG, unlike a
    /// watch channel), so several waiters stay deterministic in simulation.
    applied_waiters: Arc<tokio::sync::Notify>,
    /// Counts snapshot streams received, for their chunk keys.
    incoming_streams: Arc<std::sync::atomic::AtomicU64>,
    /// Snapshot write-outs, one at a time, and the removals of replaced
    /// snapshots' chunks that wait for them.
    writing_out: WriteOuts,
}

// A snapshot stream is the `Applied` header, then (for partitions) every
// record from its log start to its high watermark, each a separate item
// (see `snapshot_file`).

fn sm_error(verb: ErrorVerb) -> impl FnOnce(StoreError) -> StorageError {
    move |e| io_error(ErrorSubject::StateMachine, verb, e)
}

fn snapshot_error(verb: ErrorVerb) -> impl FnOnce(StoreError) -> StorageError {
    move |e| io_error(ErrorSubject::Snapshot(None), verb, e)
}

impl GroupStateMachine {
    /// Open a group's state machine, starting from `initial` if the store
    /// has none for it yet.
    pub fn open(store: Arc<NodeStore>, group: String, initial: GroupState) -> Result<Self, StoreError> {
        // A snapshot being received when the node stopped is abandoned.
        snapshot_file::remove_incoming(&store, &group)?;
        let stored = store.read(|txn| read_applied(txn, &group))?;
        let applied =
            stored.unwrap_or(Applied { last_applied: None, membership: StoredMembership::default(), state: initial });
        if let GroupState::Partition(partition) = &applied.state {
            records::index_copies_of_older_versions(&store, &group, partition.log_start(), partition.high_watermark())?;
        }
        Ok(GroupStateMachine {
            store,
            group,
            last_applied: Arc::new(Mutex::new((applied.last_applied, applied.membership))),
            working: Arc::new(Mutex::new(applied.state.clone())),
            state: Arc::new(Mutex::new(applied.state)),
            applied_notify: None,
            applied_waiters: Arc::new(tokio::sync::Notify::new()),
            incoming_streams: Arc::new(std::sync::atomic::AtomicU64::new(0)),
            writing_out: WriteOuts::default(),
        })
    }

    fn wake_watcher(&self) {
        if let Some(notify) = &self.applied_notify {
            notify.notify_one();
        }
        self.applied_waiters.notify_waiters();
    }

    /// Woken, every waiter, after each applied batch or installed snapshot.
    /// Create the `notified()` future (and `enable` it) before looking at
    /// the state, so that an apply in between is not missed.
    pub fn applied_waiters(&self) -> Arc<tokio::sync::Notify> {
        Arc::clone(&self.applied_waiters)
    }

    /// Wake `notify` after every applied batch.
    pub fn notify_on_apply(mut self, notify: Arc<tokio::sync::Notify>) -> Self {
        self.applied_notify = Some(notify);
        self
    }

    /// A metadata state machine with these (cluster-wide) limits.
    pub fn initial_metadata(limits: Limits) -> GroupState {
        GroupState::Metadata(Arc::new(MetadataState::new(limits)))
    }

    /// A partition state machine with these limits.
    pub fn initial_partition(limits: Limits) -> GroupState {
        GroupState::Partition(Arc::new(PartitionState::new(limits)))
    }

    /// The state, shared.
    pub fn state(&self) -> SharedGroupState {
        Arc::clone(&self.state)
    }

    /// Read records of this (partition) group: `read` gets a record reader.
    pub fn with_records<T>(
        &self,
        read: impl FnOnce(&PartitionState, &RecordReader<'_>) -> T,
    ) -> Result<Option<T>, StoreError> {
        // The state first, then the transaction: the transaction then sees
        // at least every record that state has committed.
        let GroupState::Partition(partition) = self.state.lock().expect("group state").clone() else { return Ok(None) };
        self.store.read(|txn| {
            let reader = RecordReader::new(txn, self.store.segments().clone(), self.group.as_str())?;
            Ok(Some(read(&partition, &reader)))
        })
    }

    fn applied(&self) -> Applied {
        let (last_applied, membership) = self.last_applied.lock().expect("applied").clone();
        Applied { last_applied, membership, state: self.working.lock().expect("group state").clone() }
    }

    async fn apply_entries(&self, entries: Vec<Entry<TypeConfig>>) -> Result<Vec<Response>, StoreError> {
        let (group, state, last_applied) = (self.group.clone(), self.working.clone(), self.last_applied.clone());
        let segments = self.store.segments().clone();
        let last = entries.last().map(|entry| entry.log_id.index);
        // Runs in a transaction that is not synced (the log replays it): its
        // own beside the writer when the writer lets it, else the writer's.
        let (responses, committed) = self
            .store
            .write_soon(last.map(|last| (self.group.as_str(), last)), move |txn| {
                let group = group.as_str();
                let mut state = state.lock().expect("group state");
                let mut log = match &*state {
                    GroupState::Partition(_) => Some(RecordWriter::new(txn, segments, group)?),
                    GroupState::Metadata(_) => None,
                };
                let mut applied = last_applied.lock().expect("applied");
                let mut responses = Vec::with_capacity(entries.len());
                for entry in entries {
                    applied.0 = Some(entry.log_id);
                    let response = match entry.payload {
                        EntryPayload::Blank => Response::None,
                        EntryPayload::Membership(membership) => {
                            applied.1 = StoredMembership::new(Some(entry.log_id), membership);
                            Response::None
                        }
                        EntryPayload::Normal(request) => match (&mut *state, request.command.as_ref()) {
                            (GroupState::Metadata(metadata), Command::Metadata(command)) => {
                                Response::Metadata(Arc::make_mut(metadata).apply(applied_at(&request), command))
                            }
                            (GroupState::Partition(partition), Command::Partition(command)) => {
                                let log = log.as_mut().expect("a partition group has a record writer");
                                // Other entries append no records: the run
                                // index needs to know only these.
                                log.entry(entry.log_id.index, command)?;
                                let partition = Arc::make_mut(partition);
                                Response::Partition(partition.apply(log, applied_at(&request), command)?)
                            }
                            _ => Response::WrongGroup,
                        },
                    };
                    responses.push(response);
                }
                if let Some(log) = log {
                    log.finish()?;
                }
                write_applied(txn, group, applied.0, &applied.1, &mut state, false)?;
                Ok((responses, state.clone()))
            })
            .await?;
        // Readers see the new state only now that its records are committed.
        *self.state.lock().expect("group state") = committed;
        Ok(responses)
    }

    /// Build a snapshot: only the state, as of the last applied entry. Its
    /// records stay where they are (the log, or copies from an earlier
    /// install), kept from the snapshot's log start on while it is current,
    /// and are written out only if a follower needs the snapshot.
    async fn build(&self) -> Result<Snapshot<TypeConfig>, StoreError> {
        // The log may be purged up to this snapshot: make the state durable.
        self.store.flush().await?;
        let stored = self.store.read(|txn| read_applied(txn, &self.group))?;
        let applied = stored.unwrap_or_else(|| self.applied());
        let snapshot_id = match applied.last_applied {
            Some(log_id) => format!("{}-{}", log_id.leader_id, log_id.index),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id: applied.last_applied,
            last_membership: applied.membership.clone(),
            snapshot_id,
        };
        let current = CurrentSnapshot::new(meta.clone(), &self.group, &applied)?;
        self.make_current(current.clone()).await?;
        self.store.ledger().snapshot_built();
        Ok(Snapshot { meta, snapshot: Box::new(self.deferred_file(current)?) })
    }

    /// The snapshot's stream, written out from the state and the records
    /// it keeps when first read (once: later reads find it sealed). The
    /// records are read as of now (`view`): a newer snapshot may let them
    /// go before this one is read.
    fn deferred_file(&self, current: CurrentSnapshot) -> Result<SnapshotFile, StoreError> {
        // The pin keeps every segment this view's rows name until the file
        // is written out, however late that is.
        let (pin, view) = self.store.begin_read()?;
        let (store, group, key, write_outs) =
            (self.store.clone(), self.group.clone(), current.key.clone(), self.writing_out.clone());
        Ok(SnapshotFile::deferred(self.store.clone(), current.key.clone(), move || {
            let one_at_a_time = write_outs.clone();
            one_at_a_time.run(&store.clone(), move || {
                let _segments_stay = &pin;
                let still_current = |store: &NodeStore| -> Result<bool, StoreError> {
                    let now = store.read(|txn| CurrentSnapshot::read(&txn.open_table(SNAPSHOTS)?, &group))?;
                    Ok(now.is_some_and(|now| now.key == key))
                };
                // Written out already (by an earlier read), unless it was
                // replaced since and its chunks removed: then write it again.
                if !snapshot_file::is_sealed(&store, &key)? {
                    write_out(&store, &group, &key, &current, &view)?;
                }
                drop(view);
                let opened = SnapshotFile::open(store.clone(), key.clone())?;
                // A replaced snapshot's chunks go now: the open file pins them.
                if !still_current(&store)? {
                    snapshot_file::remove(&store, &key)?;
                }
                Ok(opened)
            })
        }))
    }

    /// Remove the chunks of a snapshot that is no longer current: now, or
    /// when the write-out under way ends (it may be writing these very
    /// chunks). Never waits for it.
    fn remove_replaced(&self, key: &str) -> Result<(), StoreError> {
        self.writing_out.remove(&self.store, key)
    }

    /// Run `f` as a snapshot write-out would: while it runs, removals of
    /// replaced snapshots wait, and when it ends they are done. For tests.
    #[doc(hidden)]
    pub fn as_write_out<T>(&self, f: impl FnOnce() -> T) -> Result<T, StoreError> {
        self.writing_out.run(&self.store, || Ok(f()))
    }

    /// Make `current` this group's snapshot (durably), unless the current
    /// one is newer (a build can finish after an install); drop whichever
    /// snapshot lost, and the records no snapshot keeps any more.
    async fn make_current(&self, current: CurrentSnapshot) -> Result<(), StoreError> {
        let (group, row) = (self.group.clone(), postcard::to_stdvec(&current)?);
        let (key, last) = (current.key.clone(), current.meta.last_log_id);
        let loser = self
            .store
            .write(true, move |txn| {
                let previous = CurrentSnapshot::read(&txn.open_table(SNAPSHOTS)?, &group)?;
                match previous {
                    // A newer snapshot is current: this build lost.
                    Some(previous) if previous.meta.last_log_id > last => Ok((key != previous.key).then_some(key)),
                    previous => {
                        txn.open_table(SNAPSHOTS)?.insert(group.as_str(), row.as_slice())?;
                        records::forget_before(txn, &group, Offset(current.records_from))?;
                        Ok(previous.map(|p| p.key).filter(|k| *k != key))
                    }
                }
            })
            .await?;
        if let Some(loser) = loser {
            self.remove_replaced(&loser)?;
        }
        Ok(())
    }

    fn current_snapshot(&self) -> Result<Option<CurrentSnapshot>, StoreError> {
        self.store.read(|txn| CurrentSnapshot::read(&txn.open_table(SNAPSHOTS)?, &self.group))
    }

    /// Whether a new snapshot (of state only) would let log entries go
    /// that hold no retained record: the log start has passed what the
    /// current snapshot keeps, or is past offset 0 with no snapshot yet.
    pub fn snapshot_due_for_retention(&self, log_start: Offset) -> Result<bool, StoreError> {
        Ok(match self.current_snapshot()? {
            Some(current) => current.records_from != u64::MAX && log_start.0 > current.records_from,
            None => log_start.0 > 0,
        })
    }

    /// A fresh key for a snapshot being received (one per stream).
    fn incoming_key(&self) -> String {
        let stream = self.incoming_streams.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        format!("{}{stream}", snapshot_file::incoming_prefix(&self.group))
    }

    async fn install(&self, meta: &SnapshotMeta, mut file: SnapshotFile) -> Result<(), StoreError> {
        // Check the whole stream before touching anything: a malformed
        // snapshot is refused here, not half-applied in the shared writer.
        file.rewind();
        let applied: Applied = file.read_item()?.ok_or_else(|| StoreError::Snapshot("the snapshot is empty".into()))?;
        while file.read_item::<StoredRecord>()?.is_some() {}
        let received = file.key().to_string();
        let current = CurrentSnapshot::new(meta.clone(), &self.group, &applied)?;
        let key = current.key.clone();
        // The stream received is the snapshot written out: kept, sealed, to
        // send on without writing it again.
        snapshot_file::copy(&self.store, &received, &key)?;
        snapshot_file::seal(&self.store, &key)?;
        let mut reader = SnapshotFile::open(self.store.clone(), key.clone())?;
        reader.read_item::<Applied>()?;
        let (group, saved) = (self.group.clone(), postcard::to_stdvec(&current)?);
        let (last_applied, membership, mut state) =
            (applied.last_applied, applied.membership.clone(), applied.state.clone());
        // One durable transaction replaces the records and the state and
        // makes this snapshot current; the records are read a chunk at a time.
        let previous = self
            .store
            .write(true, move |txn| {
                let group = group.as_str();
                records::replace_with_copies(txn, group, || reader.read_item::<StoredRecord>())?;
                write_applied(txn, group, last_applied, &membership, &mut state, true)?;
                let previous = CurrentSnapshot::read(&txn.open_table(SNAPSHOTS)?, group)?;
                txn.open_table(SNAPSHOTS)?.insert(group, saved.as_slice())?;
                Ok(previous.map(|p| p.key))
            })
            .await?;
        for stale in previous.into_iter().filter(|k| *k != key).chain([received]) {
            self.remove_replaced(&stale)?;
        }
        self.store.ledger().snapshot_installed();
        *self.last_applied.lock().expect("applied") = (applied.last_applied, applied.membership);
        *self.working.lock().expect("group state") = applied.state.clone();
        *self.state.lock().expect("group state") = applied.state;
        self.wake_watcher();
        Ok(())
    }

    fn current(&self) -> Result<Option<Snapshot<TypeConfig>>, StoreError> {
        let Some(current) = self.current_snapshot()? else { return Ok(None) };
        let meta = current.meta.clone();
        Ok(Some(Snapshot { meta, snapshot: Box::new(self.deferred_file(current)?) }))
    }
}

/// A group's current snapshot, as stored: its state, and from which offset
/// the records it covers are kept (they are written out with the state
/// only when the snapshot is read).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct CurrentSnapshot {
    meta: SnapshotMeta,
    /// Where its stream is (or will be) written out.
    key: String,
    /// Records from this offset on are kept while this snapshot is current
    /// (`u64::MAX`: none, for the metadata group).
    pub(crate) records_from: u64,
    /// postcard(`Applied`).
    head: Vec<u8>,
}

impl CurrentSnapshot {
    fn new(meta: SnapshotMeta, group: &str, applied: &Applied) -> Result<Self, StoreError> {
        let key = format!("{group}/snapshot-{}", meta.snapshot_id);
        let records_from = match &applied.state {
            GroupState::Partition(partition) => partition.log_start().0,
            GroupState::Metadata(_) => u64::MAX,
        };
        Ok(CurrentSnapshot { meta, key, records_from, head: postcard::to_stdvec(applied)? })
    }

    /// `group`'s current snapshot. A row this version cannot read (written
    /// by an older one) counts as none: openraft then builds one anew.
    pub(crate) fn read(
        table: &impl ReadableTable<&'static str, &'static [u8]>,
        group: &str,
    ) -> Result<Option<Self>, StoreError> {
        let value = table.get(group)?;
        Ok(value.and_then(|v| postcard::from_bytes(v.value()).ok()))
    }
}

impl RaftSnapshotBuilder<TypeConfig> for GroupStateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        self.build().await.map_err(snapshot_error(ErrorVerb::Write))
    }
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotBuilder = GroupStateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        Ok(self.last_applied.lock().expect("applied").clone())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let responses = self.apply_entries(entries.into_iter().collect()).await.map_err(sm_error(ErrorVerb::Write))?;
        self.wake_watcher();
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        snapshot_file::remove_incoming(&self.store, &self.group).map_err(snapshot_error(ErrorVerb::Write))?;
        let file =
            SnapshotFile::create(self.store.clone(), self.incoming_key()).map_err(snapshot_error(ErrorVerb::Write))?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<SnapshotFile>) -> Result<(), StorageError> {
        self.install(meta, *snapshot).await.map_err(snapshot_error(ErrorVerb::Write))
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        self.current().map_err(snapshot_error(ErrorVerb::Read))
    }
}

/// The time a command applies with: the leader's stamp (G7). In simulation
/// builds the planted bug `WallClockApply` reads this replica's clock
/// instead, which the simulation must catch.
fn applied_at(request: &crate::raft::types::Request) -> keel_core::TimestampMs {
    #[cfg(madsim)]
    if keel_core::planted::is_planted(keel_core::planted::Bug::WallClockApply) {
        return crate::clock::Clock::system().now();
    }
    request.at
}

/// Write a snapshot's stream under `key` and seal it: its state, then (for
/// a partition) every record it keeps, read through `view`.
fn write_out(
    store: &Arc<NodeStore>,
    group: &str,
    key: &str,
    current: &CurrentSnapshot,
    view: &redb::ReadTransaction,
) -> Result<(), StoreError> {
    let applied: Applied = postcard::from_bytes(&current.head)?;
    let mut file = SnapshotFile::create(store.clone(), key.to_string())?;
    file.write_item(&applied)?;
    if let GroupState::Partition(partition) = &applied.state {
        // One record in memory at a time.
        let reader = RecordReader::new(view, store.segments().clone(), group)?;
        let mut offset = partition.log_start();
        #[allow(unused_mut)]
        let mut end = partition.high_watermark();
        #[cfg(madsim)]
        if keel_core::planted::is_planted(keel_core::planted::Bug::SnapshotDropsLastRecord) && end > offset {
            end = Offset(end.0 - 1);
        }
        while offset < end {
            let Some(record) = reader.get(offset)? else {
                return Err(StoreError::Inconsistent(format!(
                    "{group}'s snapshot keeps offsets from {}, but offset {offset} is not stored",
                    partition.log_start()
                )));
            };
            file.write_item(&record)?;
            offset = Offset(offset.0 + 1);
        }
    }
    file.finish()?;
    snapshot_file::seal(store, key)
}

/// One snapshot write-out at a time (two followers may need the same
/// snapshot at once), and the removals of replaced snapshots' chunks that
/// wait for it: a removal never lands between a write-out's chunks or before
/// its reader pins them, and never blocks a tokio worker for a write-out
/// (which may take seconds) either: it is queued, and the write-out's holder
/// does it when done.
#[derive(Debug, Clone, Default)]
struct WriteOuts {
    lock: Arc<Mutex<()>>,
    /// Keys of replaced snapshots whose chunks wait for a write-out to end;
    /// at most one per snapshot replaced during a write-out.
    pending: Arc<Mutex<Vec<String>>>,
}

impl WriteOuts {
    /// Remove `key`'s chunks now, or when the write-out under way ends.
    fn remove(&self, store: &NodeStore, key: &str) -> Result<(), StoreError> {
        self.pending.lock().expect("pending removals").push(key.to_string());
        self.remove_pending_unless_busy(store)
    }

    /// Run `write_out` as the only write-out, then the removals that
    /// waited for it.
    fn run<T>(&self, store: &NodeStore, write_out: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
        let held = self.lock.lock().expect("snapshot write-out");
        let written = write_out();
        self.remove_pending(store, &held)?;
        drop(held);
        // Removals queued after the one above, while the lock was still held.
        self.remove_pending_unless_busy(store)?;
        written
    }

    fn remove_pending(&self, store: &NodeStore, _held: &std::sync::MutexGuard<'_, ()>) -> Result<(), StoreError> {
        let keys = std::mem::take(&mut *self.pending.lock().expect("pending removals"));
        for key in keys {
            snapshot_file::remove(store, &key)?;
        }
        Ok(())
    }

    fn remove_pending_unless_busy(&self, store: &NodeStore) -> Result<(), StoreError> {
        if self.pending.lock().expect("pending removals").is_empty() {
            return Ok(());
        }
        match self.lock.try_lock() {
            Ok(held) => self.remove_pending(store, &held),
            // Its holder removes them when done.
            Err(std::sync::TryLockError::WouldBlock) => Ok(()),
            Err(std::sync::TryLockError::Poisoned(_)) => panic!("a snapshot write-out panicked"),
        }
    }
}
